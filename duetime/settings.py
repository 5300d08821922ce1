"""Delayed-delivery settings, with NServiceBus's names and defaults, and every ``DUETIME_*``
environment variable: the dispatcher's settings are read by :meth:`DelayedDeliverySettings.from_env`
(each field's name is its variable's), the rest are named once here and read by :func:`variable`."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

from duetime.errors import ConfigurationError, InvalidSetting
from duetime.inputs.durations import DurationTooLong, NegativeDuration, parse_duration
from duetime.message import is_timeouts_queue


class TransactionMode(enum.StrEnum):
    """How a due message moves from store to destination.

    ``AT_LEAST_ONCE`` forwards, then removes: a crash in between forwards it again under the same
    message id. ``EXACTLY_ONCE`` moves it in one transaction shared by store and destination, and is
    refused unless the transport really shares the store's transaction.
    """

    AT_LEAST_ONCE = "at-least-once"
    EXACTLY_ONCE = "exactly-once"


#: Every variable's prefix: the settings' are it and the field's name in capitals.
PREFIX = "DUETIME_"

# The variables outside the dispatcher's settings, each named once (the commands' options take
# theirs from here; the settings reference lists every one).
#: Where delayed messages are kept.
STORE_VARIABLE = "DUETIME_STORE"
#: Where due messages go.
TRANSPORT_VARIABLE = "DUETIME_TRANSPORT"
#: The endpoint.
ENDPOINT_VARIABLE = "DUETIME_ENDPOINT"
#: The error queue of the commands that read or write it (the dispatcher's setting has the same name).
ERROR_QUEUE_VARIABLE = "DUETIME_ERROR_QUEUE"
#: The RabbitMQ of the `rabbitmq` commands, after DUETIME_TRANSPORT.
RABBITMQ_VARIABLE = "DUETIME_RABBITMQ"
#: text or json logs.
LOG_FORMAT_VARIABLE = "DUETIME_LOG_FORMAT"
#: Tracebacks and the drivers' own logs, for a bug report.
DEBUG_VARIABLE = "DUETIME_DEBUG"
#: Spark's own logs, for a bulk job that fails inside Spark.
SPARK_LOGS_VARIABLE = "DUETIME_SPARK_LOGS"
#: `duetime run`'s front door, delivery log, metrics and readiness.
FRONT_DOOR_VARIABLE = "DUETIME_FRONT_DOOR"
DELIVERY_LOG_VARIABLE = "DUETIME_DELIVERY_LOG"
METRICS_PORT_VARIABLE = "DUETIME_METRICS_PORT"
METRICS_HOST_VARIABLE = "DUETIME_METRICS_HOST"
READY_AFTER_VARIABLE = "DUETIME_READY_AFTER"
#: `duetime run`'s routes: PATTERN=TRANSPORT_URL items, separated by spaces.
ROUTES_VARIABLE = "DUETIME_ROUTES"
#: The dashboard's address, its login and what signs its forms (the last two are secrets: never shown).
DASHBOARD_HOST_VARIABLE = "DUETIME_DASHBOARD_HOST"
DASHBOARD_PORT_VARIABLE = "DUETIME_DASHBOARD_PORT"
DASHBOARD_USER_VARIABLE = "DUETIME_DASHBOARD_USER"
DASHBOARD_PASSWORD_VARIABLE = "DUETIME_DASHBOARD_PASSWORD"
DASHBOARD_SECRET_VARIABLE = "DUETIME_DASHBOARD_SECRET"
#: The keyring that seals what messages hold before any store keeps it (``duetime keys new FILE``).
ENCRYPTION_KEYS_VARIABLE = "DUETIME_ENCRYPTION_KEYS"
#: Who the commands' changes are kept as in the audit trail (the user at the host when unset).
ACTOR_VARIABLE = "DUETIME_ACTOR"
#: Set by ``duetime serve --workers N`` in each worker it starts: the watching process's id.
SERVE_WORKER_VARIABLE = "DUETIME_SERVE_WORKER_OF"
#: The variables whose values are secrets: never printed, kept out of every line shown.
SECRET_VARIABLES = (DASHBOARD_PASSWORD_VARIABLE, DASHBOARD_SECRET_VARIABLE)
#: The variables read outside the commands' own options and the dispatcher's settings.
OTHER_VARIABLES = (
    ACTOR_VARIABLE,
    DEBUG_VARIABLE,
    ENCRYPTION_KEYS_VARIABLE,
    SPARK_LOGS_VARIABLE,
    DASHBOARD_USER_VARIABLE,
    DASHBOARD_PASSWORD_VARIABLE,
    DASHBOARD_SECRET_VARIABLE,
    SERVE_WORKER_VARIABLE,
)


def variable(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of the ``DUETIME_*`` variable ``name`` (one of this module's), None when unset
    or empty: the one place duetime reads its environment."""
    return (os.environ if environ is None else environ).get(name) or None


#: The command-line options a variable fills in when the command line does not give them: by
#: flag, in every command that has it (the first variable set wins).
OPTION_VARIABLES: Mapping[str, tuple[str, ...]] = {
    "--store": (STORE_VARIABLE,),
    "--transport": (TRANSPORT_VARIABLE,),
    "--endpoint": (ENDPOINT_VARIABLE,),
    "--error-queue": (ERROR_QUEUE_VARIABLE,),
    "--log-format": (LOG_FORMAT_VARIABLE,),
    "--front-door": (FRONT_DOOR_VARIABLE,),
    "--route": (ROUTES_VARIABLE,),
    "--delivery-log": (DELIVERY_LOG_VARIABLE,),
    "--metrics-port": (METRICS_PORT_VARIABLE,),
    "--metrics-host": (METRICS_HOST_VARIABLE,),
    "--ready-after": (READY_AFTER_VARIABLE,),
}
#: Where a command group reads an option otherwise, by (the group's word, a flag); () is none.
GROUP_OPTION_VARIABLES: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("dashboard", "--host"): (DASHBOARD_HOST_VARIABLE,),
    ("dashboard", "--port"): (DASHBOARD_PORT_VARIABLE,),
    ("rabbitmq", "--transport"): (TRANSPORT_VARIABLE, RABBITMQ_VARIABLE),
    # bulk jobs take every endpoint they find unless told: an endpoint from the environment would
    # quietly narrow a migration to one of them; a report's delivery log is a file to read
    ("bulk", "--endpoint"): (),
    ("bulk", "--delivery-log"): (),
}


def option_variables(group: str, flags: Sequence[str]) -> tuple[str, ...]:
    """The variables that give the option written ``flags`` its value in the commands of
    ``group`` (a command's first word) when the command line does not."""
    for flag in flags:
        if (group, flag) in GROUP_OPTION_VARIABLES:
            return GROUP_OPTION_VARIABLES[group, flag]
    return next((OPTION_VARIABLES[flag] for flag in flags if flag in OPTION_VARIABLES), ())


def option_value(names: Sequence[str], given: Mapping[str, str] | None = None) -> str | None:
    """The value of the first of ``names`` that is set: in ``given`` (what the command line said
    before the command, as its variable), else in the environment."""
    return next((found for name in names if (found := (given or {}).get(name) or variable(name))), None)


def _is_port(text: str) -> bool:
    return text.isdigit() and 0 <= int(text) <= 65535


def _is_seconds(text: str) -> bool:
    try:
        return 0 <= float(text) < float("inf")
    except ValueError:
        return False


#: What an option's variable must hold where the option takes more than text (a command that
#: reads it refuses it in one line naming the variable, not the option the user never typed).
OPTION_VALUE_RULES: Mapping[str, tuple[str, Callable[[str], bool]]] = {
    METRICS_PORT_VARIABLE: ("a port, 0-65535", _is_port),
    DASHBOARD_PORT_VARIABLE: ("a port, 0-65535", _is_port),
    READY_AFTER_VARIABLE: ("seconds, 0 or more", _is_seconds),
    LOG_FORMAT_VARIABLE: ("text or json", lambda text: text.lower() in ("text", "json")),
    FRONT_DOOR_VARIABLE: (
        "true or false",
        lambda text: text.lower() in ("1", "0", "true", "false", "yes", "no"),
    ),
}


def check_option_value(name: str, value: str) -> None:
    """ConfigurationError when the variable ``name`` holds what its option cannot take."""
    rule = OPTION_VALUE_RULES.get(name)
    if rule is not None and not rule[1](value.strip()):
        raise ConfigurationError(f"{name}={value!r} is not allowed: give {rule[0]}.")


def option_variable_names() -> set[str]:
    """Every variable a command-line option reads."""
    return {
        name for names in [*OPTION_VARIABLES.values(), *GROUP_OPTION_VARIABLES.values()] for name in names
    }


#: The endpoint every command, client and server uses unless told another.
DEFAULT_ENDPOINT = "duetime"
#: The error queue every dispatcher uses unless told another.
DEFAULT_ERROR_QUEUE = "error"
#: Where the dashboard listens unless told otherwise: this machine only.
DEFAULT_DASHBOARD_HOST, DEFAULT_DASHBOARD_PORT = "127.0.0.1", 8080

#: A lateness budget above this would be a delay, not a budget.
MAX_LATENESS_BUDGET = timedelta(seconds=1)
#: The most a dispatcher claims ahead: a claim held in memory longer only keeps a cancel waiting.
MAX_CLAIM_WINDOW = timedelta(seconds=1)
#: The shortest each time may be. Shorter, a call cannot finish or a breaker cannot see an
#: outage from a slow answer: a 1 µs operation timeout or a 1 ms breaker made every call a
#: failure, a made-up outage that ended the dispatcher.
SHORTEST = {
    "time_to_trigger_store_circuit_breaker": timedelta(seconds=1),
    "time_to_trigger_fetch_circuit_breaker": timedelta(seconds=1),
    "time_to_trigger_dispatch_circuit_breaker": timedelta(seconds=1),
    "time_to_wait_before_triggering_critical_error_on_timeout_outages": timedelta(seconds=1),
    "claim_timeout": timedelta(seconds=1),
    "operation_timeout": timedelta(milliseconds=100),
    "stop_timeout": timedelta(seconds=1),
    "max_sleep": timedelta(milliseconds=1),
}


@dataclass(frozen=True, slots=True)
class DelayedDeliverySettings:
    """How the dispatcher behaves. Defaults are NServiceBus's (its ``DelayedDeliverySettings``)."""

    #: How many more times a message the destination refused is tried before the error queue.
    number_of_retries: int = 0
    #: How long the store may fail its writes after a send (removing what was delivered,
    #: counting failures) before the critical error.
    time_to_trigger_store_circuit_breaker: timedelta = timedelta(seconds=30)
    #: How long claiming due messages may fail before the critical error.
    time_to_trigger_fetch_circuit_breaker: timedelta = timedelta(seconds=30)
    #: How long sending to destinations may fail (a broker down) before the critical error.
    time_to_trigger_dispatch_circuit_breaker: timedelta = timedelta(seconds=30)
    #: As NServiceBus's timeout manager has it: how long the front door may fail to get delayed messages into
    #: storage before the critical error. Longer than the store breaker's, because the messages
    #: wait safely on their queue meanwhile; nothing is lost by waiting.
    time_to_wait_before_triggering_critical_error_on_timeout_outages: timedelta = timedelta(minutes=2)
    #: How many failures of error handling (counting a failure, a refused error-queue message) a
    #: second are tolerated before the critical error.
    maximum_recovery_failures_per_second: int = 1
    #: at-least-once (send, then remove) or exactly-once (one transaction, where the transport
    #: shares the store's). Not set: the safest the store and transport keep, exactly-once where
    #: they share a transaction (a store delivering into its own queue tables), else
    #: at-least-once; the dispatcher decides, so `duetime run` and an embedded Service agree.
    transaction_mode: TransactionMode | None = None
    #: Where a message that cannot be delivered goes, with why. Only dispatchers write there: the
    #: commands and the front door refuse it as a destination (and an endpoint's timeouts queue).
    error_queue: str = DEFAULT_ERROR_QUEUE
    #: How many due messages one claim takes; one round trip moves a batch, not a row.
    batch_size: int = 100
    #: No sleep is longer than this, whatever the next due time says.
    max_sleep: timedelta = timedelta(minutes=1)
    #: How late the dispatcher may wake for the next due message, so that one round takes every
    #: message due by then: at a steady few hundred a second, a round (and its CPU) per several
    #: messages instead of one each. Never early; zero wakes on each message's due time.
    lateness_budget: timedelta = timedelta(milliseconds=1)
    #: How far ahead of their due time an at-least-once dispatcher claims messages, to send each
    #: from memory at its due time (never before): one claim and one removal for all that come
    #: due within it, instead of a round each. A message claimed ahead is being delivered: a
    #: cancel or reschedule is refused with a one-line error (look again in a moment). A kill
    #: gives it back when its claim lapses, as for any claim. An exactly-once move into a queue
    #: whose rows carry the time they become visible (SQLite, PostgreSQL) takes them ahead the
    #: same way, each visible from its due time. Zero claims and moves only what is due.
    claim_window: timedelta = timedelta(milliseconds=50)
    #: How long a claimed batch stays hidden from other dispatchers before it is taken back.
    claim_timeout: timedelta = timedelta(seconds=30)
    #: Pause after a failure while a circuit breaker is armed, so an outage is not a hot loop.
    #: It doubles while the failures go on, up to ``max_failure_backoff``.
    failure_backoff: timedelta = timedelta(seconds=1)
    max_failure_backoff: timedelta = timedelta(seconds=5)
    #: The longest any one store or transport call may take before it counts as a failure. A
    #: network partition does not reset connections, it just stops answering: without a deadline
    #: a call would wait forever and no breaker would ever trip. The dispatcher uses this or half
    #: of the breaker's time, whichever is shorter.
    operation_timeout: timedelta = timedelta(seconds=10)
    #: While it works, ``duetime run`` logs one summary line this often (forwarded, dead-lettered,
    #: retried, lateness p50/p99, backlog); zero turns it off.
    summary_interval: timedelta = timedelta(minutes=1)
    #: How long a stopping ``duetime run`` (a stop signal, a critical error) may take to close its
    #: connections before it leaves anyway: a partitioned server can hold a driver's read for many
    #: minutes, and a supervisor can only restart a process that has ended.
    stop_timeout: timedelta = timedelta(seconds=30)

    def __post_init__(self) -> None:
        if self.number_of_retries < 0:
            raise InvalidSetting("number_of_retries", "must be 0 or more")
        if self.maximum_recovery_failures_per_second < 1:
            raise InvalidSetting("maximum_recovery_failures_per_second", "must be 1 or more")
        if not 1 <= self.batch_size <= 10_000:
            raise InvalidSetting("batch_size", "must be from 1 to 10,000")
        for name, shortest in SHORTEST.items():
            if getattr(self, name) < shortest:
                raise InvalidSetting(name, f"must be at least {_said(shortest)}")
        if self.failure_backoff < timedelta(0) or self.max_failure_backoff < self.failure_backoff:
            raise ConfigurationError(
                "failure_backoff must not be negative, and max_failure_backoff not shorter than it."
            )
        if not timedelta(0) <= self.lateness_budget <= MAX_LATENESS_BUDGET:
            raise InvalidSetting("lateness_budget", "must be from 0 to 1 second")
        if not timedelta(0) <= self.claim_window <= MAX_CLAIM_WINDOW:
            raise InvalidSetting("claim_window", "must be from 0 to 1 second")
        if self.claim_window * 2 > self.claim_timeout:
            raise InvalidSetting("claim_window", "must be at most half the claim_timeout")
        if self.summary_interval < timedelta(0):
            raise InvalidSetting("summary_interval", "must not be negative (zero turns it off)")
        if not self.error_queue.strip():
            raise InvalidSetting("error_queue", "must name a queue")
        if is_timeouts_queue(self.error_queue):
            raise InvalidSetting(
                "error_queue", "must not be an endpoint's timeouts queue (what arrives there is stored again)"
            )
        if self.transaction_mode is not None:
            object.__setattr__(self, "transaction_mode", TransactionMode(self.transaction_mode))

    def with_changes(self, **changes: Any) -> DelayedDeliverySettings:
        return replace(self, **changes)

    @classmethod
    def from_env(
        cls, prefix: str = PREFIX, environ: Mapping[str, str] | None = None
    ) -> DelayedDeliverySettings:
        """Read ``DUETIME_NUMBER_OF_RETRIES=7`` etc.; durations as the CLI takes them (90, 1.5s, 10m)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for item in fields(cls):
            raw = env.get(prefix + item.name.upper())
            if raw is None:
                continue
            values[item.name] = setting_value(item.name, f"{prefix}{item.name.upper()}={raw!r}", raw)
        try:
            return cls(**values)
        except InvalidSetting as error:  # said with the variable that gave it
            if error.setting in values:
                variable = prefix + error.setting.upper()
                raise error.named(f"{variable}={env[variable]!r}") from None
            raise
        except ConfigurationError as error:
            raise ConfigurationError(f"{error} (read from {prefix}* environment variables)") from None


def setting_value(name: str, given: str, raw: str) -> object:
    """The setting ``name`` read from text, as an environment variable or a flag gives it;
    ``given`` says where it came from in the error (``DUETIME_MAX_SLEEP='x'``, ``--lateness-budget x``)."""
    default = getattr(DelayedDeliverySettings(), name)
    if isinstance(default, timedelta):
        try:
            return parse_duration(raw)
        except NegativeDuration:
            raise ConfigurationError(f"{given} must not be negative.") from None
        except DurationTooLong:
            raise ConfigurationError(f"{given} is too long; write e.g. 30s, 10m or 1h.") from None
        except ValueError:
            raise ConfigurationError(
                f"{given} is not a duration; write e.g. 90, 1.5s, 250ms, 10m or 1h30m."
            ) from None
    if name == "transaction_mode":
        choices = [mode.value for mode in TransactionMode]
        try:
            return TransactionMode(raw.strip().lower().replace("_", "-"))
        except ValueError:
            raise ConfigurationError(f"{given} is not a mode; use one of {choices}.") from None
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigurationError(f"{given} is not a whole number.") from None
    return raw


def _said(span: timedelta) -> str:
    seconds = span.total_seconds()
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1000:g} ms"


def misspelt(known: set[str], environ: Mapping[str, str] | None = None, prefix: str = PREFIX) -> list[str]:
    """A line for each ``DUETIME_*`` variable that is not one duetime reads but is spelt much like
    one (``NUMBER_OF_RETRY`` for ``NUMBER_OF_RETRIES``): it would be ignored, silently, though meant."""
    import difflib

    said = []
    for name in sorted(os.environ if environ is None else environ):
        if not name.startswith(prefix) or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.9)
        if close:
            said.append(f"{name} is not a duetime variable, so it is ignored; did you mean {close[0]}?")
    return said


def setting_variables(prefix: str = PREFIX) -> set[str]:
    """The variables :meth:`DelayedDeliverySettings.from_env` reads."""
    return {prefix + item.name.upper() for item in fields(DelayedDeliverySettings)}
