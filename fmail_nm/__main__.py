from .cli import main

# Guarded: worker processes (the mirror's parsing pool) import this module under another name.
if __name__ == "__main__":
    raise SystemExit(main())
