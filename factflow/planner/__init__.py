"""factflow.planner."""
