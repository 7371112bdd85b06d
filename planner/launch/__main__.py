"""``python -m planner.launch`` (what launch.sh runs under accelerate launch)."""

from planner.launch.train import main

if __name__ == "__main__":
    main()
