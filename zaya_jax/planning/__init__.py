"""The planner: a run's memory, FLOPs, collectives and step time at cluster scale, without the hardware
(docs/planner.md). `plan.plan` is the entry point (`python -m launch.plan`); the trainer imports only
`sizing` (the hardware table of MFU peaks), so nothing is imported here: importing this package costs nothing.
"""
