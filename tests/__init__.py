# Importing weir first puts the repository root last on sys.path (weir/__init__.py says why).
import weir  # noqa: F401
