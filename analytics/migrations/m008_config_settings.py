"""Version 8: the latest value of every setting, kept as long as the config topic keeps it.

``config_changes`` expires a year after each event, but the config topic is compacted: a setting
made more than a year ago and not made since is still in force, and was gone from the store (the
cost report then priced GPUs at their defaults). ``config_settings`` keeps each ``config_set``
row, without TTL, and merges to one row per setting (the latest by time); a reader takes the
latest of each with ``argMax(value, (time, kafka_offset))``, which is exact before merges too. It
holds what a consumer reading the compacted topic from its start sees: each setting's last value.
The view sees every inserted block, a config record older than a year too (which
``config_changes`` drops as it is inserted). Statements that run again (an interrupted
migration) add rows of values already there, which change no setting's latest. Settings
``config_changes`` had already expired when this version was applied are not recovered.
"""

STATEMENTS = [
    """
CREATE TABLE IF NOT EXISTS config_settings (
    setting LowCardinality(String),
    value String,
    set_by LowCardinality(String),
    time DateTime64(3),
    kafka_offset UInt64
) ENGINE = ReplacingMergeTree(time)
ORDER BY setting""",
    """
CREATE MATERIALIZED VIEW IF NOT EXISTS config_settings_mv TO config_settings AS
SELECT setting, value, set_by, time, kafka_offset FROM config_changes
WHERE type = 'config_set'""",
    # Those config_changes still holds (nothing is inserted while migrations run).
    """
INSERT INTO config_settings (setting, value, set_by, time, kafka_offset)
SELECT setting, value, set_by, time, kafka_offset FROM config_changes
WHERE type = 'config_set'""",
]
