"""Commands over every node of an inventory that are not a run: `orch exec`, `orch sync` and
`orch image push`.

- `exec.py`  one command on every node in parallel over the transport; every node's answer
             collected (`ExecReport`), grouped by identical output, the worst exit code
- `sync.py`  `job.sync` onto every node (`Transport.copy_tree`, bounded in parallel) into a
             `SyncReport`; what --delete must not remove
- `image.py` a container image onto every node without a registry: exported once, streamed into
             each node's runtime (`Transport.pipe`), skipped where the node holds its ID, the ID
             checked after loading
- `chain.py` the copy chain of both (`--method chain`): one copy from here, relayed node to node
             by `node/relay.py` over TCP, verified chunk by chunk and file by file, a dead node
             spliced out (`Chain`); its pure parts (the topology and its mending, the judges of a
             silent or stalled member, the choice of method, the room check)

Each asks the node's transport, through one fan-out (`Cluster.fan_out`: progress, Ctrl-C), or
starts a relay on it with `Transport.spawn`.

Like the rest of the library they print nothing: `cli/render/` shows what they return.
"""
