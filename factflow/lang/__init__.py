"""factflow.lang."""
