"""C sources shipped into every export: the API header, the runtime, the portable BLAS loops
and the example programs (package data, read with ``importlib.resources``)."""
