"""One address in front of several inference workers: routes each call to a worker that has the model."""
