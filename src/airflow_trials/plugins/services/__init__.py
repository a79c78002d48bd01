"""The dashboard's view builders, one per page, over the store's reads (as Airflow's own
``api_fastapi/core_api/services``): what a page shows, built before :mod:`..routes` renders it."""
