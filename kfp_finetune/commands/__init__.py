"""CLI subcommands that are not owned by one component (each exposes add_arguments and run)."""
