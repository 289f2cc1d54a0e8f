"""The .nnb backend: nnabla-c-runtime's binary network format."""
