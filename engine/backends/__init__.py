"""Fast step backends beside the torch reference (`engine/model.py`), each behind the same step interface."""
