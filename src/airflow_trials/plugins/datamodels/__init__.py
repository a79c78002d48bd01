"""The JSON API's response models, one module per resource (as Airflow's own
``api_fastapi/core_api/datamodels``): what ``/trials/api/...`` returns and its OpenAPI schema
shows."""
