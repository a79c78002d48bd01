"""Tests of the docker-compose stack and the deployment scripts under deploy/."""
