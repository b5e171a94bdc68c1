"""The training program torchrun starts on every node.

A small DDP loop over ultralytics' YOLO12 and YOLOE models, loss, datasets, augmentation,
validator and EMA. It reads its topology only from torchrun's environment (RANK, LOCAL_RANK,
WORLD_SIZE) and never touches the network. Entry point: ``python -m trainer --help``.
"""
