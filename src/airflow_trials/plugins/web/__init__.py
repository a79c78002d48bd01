"""What the dashboard's routes share about a request: who may read what (auth), the validated
path and query parameters (params), the access-checked reads (reads) and the pages' rendering
(render)."""
