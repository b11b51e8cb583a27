"""The schedule forms of Prefect's prefect.yaml, read for ``vlcorpus deploy``: ``cron`` (with
``day_or``), ``interval`` in seconds (with ``anchor_date``), ``rrule``; each with ``timezone``,
``active``, ``parameters`` and ``slug``. Anything else is refused in one line before any
deployment is registered, rather than failing when the schedule first fires. Prefect's own
schedule schemas check the values."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule, RRuleSchedule
from prefect.schedules import Schedule
from pydantic import BaseModel, ValidationError

_FORMS: dict[str, tuple[type[BaseModel], set[str]]] = {
    "cron": (CronSchedule, {"timezone", "day_or"}),
    "interval": (IntervalSchedule, {"timezone", "anchor_date"}),
    "rrule": (RRuleSchedule, {"timezone"}),
}
# Keys of the deployment's schedule itself, beside the form's.
_OPTIONS = {"active", "parameters", "slug"}


class ScheduleError(ValueError):
    """A schedule vlcorpus deploy cannot read; the message is one line."""


def read_schedule(item: Any) -> Schedule:
    """One entry of a deployment's ``schedules`` as Prefect's schedule; ScheduleError otherwise."""
    if not isinstance(item, dict):
        raise ScheduleError(f"a schedule is a mapping with one of {', '.join(_FORMS)} (got {item!r})")
    forms = [form for form in _FORMS if form in item]
    if len(forms) != 1:
        raise ScheduleError(f"a schedule has exactly one of {', '.join(_FORMS)} (got "
                            f"{', '.join(sorted(map(str, item))) or 'nothing'})")
    form = forms[0]
    schema, keys = _FORMS[form]
    unknown = sorted(map(str, set(item) - {form} - keys - _OPTIONS))
    if unknown:
        raise ScheduleError(f"{form} schedule: unknown key {', '.join(unknown)} (allowed: "
                            f"{', '.join(sorted(keys | _OPTIONS))})")
    values = {key: item[key] for key in (form, *keys) if key in item}
    if form == "interval":
        seconds = values["interval"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
            raise ScheduleError(f"interval must be a positive number of seconds (got {seconds!r})")
        values["interval"] = timedelta(seconds=seconds)
    try:
        checked = schema.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ScheduleError(f"{form} schedule: {first['msg']} ({form}: {item[form]!r})") from None
    parameters = item.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ScheduleError("a schedule's parameters are a mapping of flow parameters")
    return Schedule(**checked.model_dump(exclude_unset=True), active=bool(item.get("active", True)),
                    parameters=parameters or {}, slug=item.get("slug"))
