"""Build the optional C codec; the project's metadata lives in pyproject.toml.

``engine._codec`` (engine/_codec.c) is the compiled twin of engine/codec_py.py.
It is optional: without a C compiler (or zlib's headers) the install still
succeeds and ``engine.codec`` falls back to the Python reference.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "engine._codec",
            ["engine/_codec.c"],
            libraries=["z"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        ),
    ],
)
