"""The architectures built in process: fast."""
from tiers import room_tiers

ROOM = "fast"
EXCEPTIONS: dict = {}

pytest_collection_modifyitems = room_tiers(__file__, ROOM, EXCEPTIONS)
