"""`compactd demo`: a local cluster (compactd.local), a workload, the job and the dashboards, in one command."""
