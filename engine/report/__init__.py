"""What a person reads, recomputed from stored facts: status and the next action, views for
the faces, notebook HTML, the DAG picture, the handover bundle and its narrative."""
