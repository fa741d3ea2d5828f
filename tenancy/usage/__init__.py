"""What was spent: usage rows, the durable spool and its codec, the writer, rollups and reports."""
