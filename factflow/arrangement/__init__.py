"""factflow.arrangement."""
