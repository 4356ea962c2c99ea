"""K virtual devices in one process: real torch math per device, collectives that count bytes."""
