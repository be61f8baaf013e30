"""accuracy: find which op broke the numbers when a PyTorch model moves to another backend."""

__version__ = "0.1.0"
