"""factflow.dataflow."""
