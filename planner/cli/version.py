"""planner's version, as the installed distribution states it (``planner --version``)."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from planner.core.distribution import DIST

    try:
        return installed(DIST)
    except PackageNotFoundError:
        import planner

        return getattr(planner, "__version__", "unknown")
