"""Safe extraction of what a sandbox sends back (see ``archive.py``), and its bounds."""

from osmosis_harbor.sandbox.transfer.extract.archive import DroppedMember, ExtractResult, extract_archive
from osmosis_harbor.sandbox.transfer.extract.files import copy_into, write_file
from osmosis_harbor.sandbox.transfer.extract.limits import TransferLimits

__all__ = ["DroppedMember", "ExtractResult", "TransferLimits", "copy_into", "extract_archive", "write_file"]
