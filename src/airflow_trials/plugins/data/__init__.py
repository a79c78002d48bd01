"""The dashboard's reads under its pages: the leaderboard page over the store's batch reads
(queries) and a trial's stdout and stderr from trial storage (logs)."""
