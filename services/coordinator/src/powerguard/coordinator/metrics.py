from prometheus_client import Counter, Gauge, Histogram

LEADER = Gauge("powerguard_coordinator_leader", "1 while this replica holds the lease")
OPEN_SAGAS = Gauge("powerguard_sagas_open", "Sagas not yet terminal")
SHUTTING_DOWN = Gauge(
    "powerguard_sagas_shutting_down",
    "Open sagas shutting nodes down on purpose or holding them down (alert inhibition: nodes off is expected)",
    ["site"],
)
TRANSITIONS = Counter("powerguard_saga_transitions_total", "Saga state changes", ["state"])
COMMANDS = Counter("powerguard_saga_commands_total", "Commands issued", ["kind"])
SQUATTED = Counter(
    "powerguard_coordinator_squatted_total",
    "A first publish of a command or state event that JetStream reported as a duplicate: someone published "
    "its id first (an attack, or a second coordinator)",
)
TICK_ERRORS = Counter("powerguard_coordinator_tick_errors_total", "Clock ticks that failed (retried at the next)")
IGNORED = Counter("powerguard_coordinator_ignored_total", "Inputs that matched no saga", ["reason"])
REAL_POWER_IGNORED = Counter(
    "powerguard_coordinator_real_power_ignored_total",
    "Real (not drill) power events set aside: stale (stored longer ago than max_event_age_s) or future "
    "(stored ahead of the coordinator's clock by more than max_clock_skew_s)",
    ["reason"],
)
MISSING_RANKS = Gauge("powerguard_saga_missing_ranks", "Ranks that did not ack in the last partial checkpoint")
RESERVE = Gauge("powerguard_shutdown_reserve_seconds", "Battery runtime kept for the shutdown (policy)")
CHECKPOINT_SECONDS = Histogram(
    "powerguard_checkpoint_duration_seconds",
    "A rank's checkpoint for a saga, request seen to durable (from its ack)",
    ["job"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
)
UPS_PREDICTED = Gauge(
    "powerguard_ups_runtime_predicted_seconds",
    "The UPS's own runtime estimate when its last outage began (real outages)",
    ["ups"],
)
UPS_OBSERVED = Gauge(
    "powerguard_ups_runtime_observed_seconds",
    "The runtime its last outage's measured discharge gives from the same charge, at the load observed",
    ["ups"],
)
UPS_RATIO = Gauge(
    "powerguard_ups_runtime_ratio",
    "Observed over predicted runtime in the UPS's last outage: below 1 its estimate is optimistic (aged battery)",
    ["ups"],
)
UPS_HEADROOM = Gauge(
    "powerguard_ups_headroom_seconds",
    "Observed full-charge runtime less what the site needs of it (the slowest measured checkpoint, the measured "
    "shutdown or the reserve, the margin): below 0 the UPS can no longer cover a checkpoint and a shutdown",
    ["ups"],
)
SHUTDOWN_MEASURED = Gauge(
    "powerguard_shutdown_measured_seconds",
    "A node group's slowest measured shutdown (stop -> every node off)",
    ["group"],
)

# label training_job: Prometheus's own `job` label names the scrape target
JOB_RANKS_HEARD = Gauge(
    "powerguard_job_ranks_registered",
    "A job's ranks heard within the agents' TTL (registration or heartbeat): below its world size, ranks fell "
    "off the bus (revoked or expired credential, a network or broker problem) and an outage cannot reach them",
    ["training_job"],
)
JOB_WORLD_SIZE = Gauge(
    "powerguard_job_world_size", "A registered job's ranks (its rank 0's world size)", ["training_job"]
)
JOB_LAST_HEARD = Gauge(
    "powerguard_job_last_heard_timestamp_seconds", "When a rank of the job was last heard (Unix time)", ["training_job"]
)
JOB_CREDENTIAL_EXPIRY = Gauge(
    "powerguard_job_credential_expiry_timestamp_seconds",
    "When the first of a job's ranks' NATS credentials expires (Unix time; absent: none expires)",
    ["training_job"],
)
