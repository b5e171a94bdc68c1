"""``python -m trainer``: run the training entry point, or with ``--check`` only check its
arguments as a start would (``trainer/check.py``, which imports torch only after the cheap
refusals)."""

import sys

if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        from trainer.check import main as check_main

        sys.exit(check_main())
    from trainer.train import main

    main()
