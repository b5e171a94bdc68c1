"""Build hook for the one optional C extension; everything else is declared in setup.cfg.

`orchestrator.logs._fastmerge` merges node logs into plain text (what `orch logs RUN > file` and
merged.log do) at C speed. It is optional: without a C compiler and Python headers the install
still succeeds and orch uses the pure-Python merge, which produces the same bytes.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "orchestrator.logs._fastmerge",
            ["orchestrator/logs/_fastmerge.c"],
            optional=True,
            # keys with clock offsets must round exactly as Python's float arithmetic does
            extra_compile_args=["-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        )
    ],
)
