"""Moving jobs between nodes: one job through the migration primitive (`migrate`), a node's jobs
after a cordon (`nodeops`: cordon, uncordon, drain), the fleet's consolidation plan (`consolidate`).
Each module is public: the CLI, the actions service and playbook steps call them."""
