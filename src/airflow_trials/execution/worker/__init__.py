"""Code that runs inside a trial's Ray actor (a Ray worker process): the trainable APIs, the trial
actor and the holds where a self-driving actor waits for its scheduler's verdict."""
