"""Only the optional native verifier; everything else is in pyproject.toml.

``ares_events._native`` (C, sources in ``ares_events/_native_src``) is
built when a C compiler and the Python headers are there; when the build fails,
``pip install`` still succeeds (``optional=True``) and the package uses its pure-Python
verifier (``ares_events/integrity/verifier.py``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ares_events._native",
            sources=["ares_events/_native_src/_native.c"],
            depends=["ares_events/_native_src/blake3_portable.h"],
            optional=True,
        )
    ]
)
