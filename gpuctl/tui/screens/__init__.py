"""The dashboard's screens: overview (the fleet), queue, jobs, one job, one node."""
