"""Alerts: thresholds on the metrics, evaluated periodically; a rule crossing its threshold
*fires*, and *resolves* when it falls back. Each change is logged and, when
``CONVEYOR_ALERT_WEBHOOK_URL`` is set, posted there as JSON.

Two rooms, so that the decision stays pure: :mod:`conveyor.alerts.rules` (two snapshots in, the
changes out) and :mod:`conveyor.alerts.duty` (the duty of every worker's duty thread that takes
the snapshot, wins the turn, stores the state and announces the changes).
"""
