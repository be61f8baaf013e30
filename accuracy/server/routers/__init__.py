"""One APIRouter per resource: runs, ops and tensors, jobs, reports, health, and the web UI."""
