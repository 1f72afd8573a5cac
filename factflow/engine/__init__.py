"""factflow.engine: the embedded engine (facade, epochs, state, installs, deliveries, reports),
query handles and the Spark session; imports every lower layer (model, lang, arrangement,
dataflow, planner) and is imported by none of them.
"""
