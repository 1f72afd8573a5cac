"""factflow.io."""
