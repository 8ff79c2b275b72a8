"""Cron in a timezone: fire times through DST changes, refusals that say what is wrong, and
what a late check starts under each misfire policy. Pure: no database, no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from conveyor.engine.cron import COUNT_LIMIT, Cron, MisfirePolicy, parse_cron, plan_fires
from conveyor.exceptions import ScheduleError

NEW_YORK = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def fires_between(cron: Cron, start: datetime, end: datetime) -> list[datetime]:
    found, moment = [], start
    while (moment := cron.next_after(moment)) < end:
        found.append(moment)
    return found


def local_day(year: int, month: int, day: int) -> tuple[datetime, datetime]:
    """From just before local midnight to the next local midnight, in UTC."""
    start = datetime(year, month, day, tzinfo=NEW_YORK)
    end = datetime.combine(start.date() + timedelta(days=1), start.time(), NEW_YORK)
    return start.astimezone(UTC) - timedelta(microseconds=1), end.astimezone(UTC)


# -- fire times ------------------------------------------------------------------------------


def test_fire_times_follow_the_schedules_own_timezone() -> None:
    cron = parse_cron("0 9 * * 1-5", "Europe/Paris")

    # Saturday noon UTC: the next weekday 09:00 in Paris is Monday 08:00 UTC (CET, winter)
    assert cron.next_after(utc(2026, 11, 21, 12)) == utc(2026, 11, 23, 8)
    # in summer (CEST) the same wall-clock time is 07:00 UTC
    assert cron.next_after(utc(2026, 7, 4, 12)) == utc(2026, 7, 6, 7)


def test_next_after_is_strictly_after_the_moment() -> None:
    cron = parse_cron("*/15 * * * *", "UTC")

    assert cron.next_after(utc(2026, 1, 1, 10, 15)) == utc(2026, 1, 1, 10, 30)
    assert cron.next_after(utc(2026, 1, 1, 10, 14, 59, 999999)) == utc(2026, 1, 1, 10, 15)


def test_a_time_in_the_skipped_spring_forward_hour_runs_once_right_after_the_gap() -> None:
    # 2026-03-08 in New York: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist that day
    cron = parse_cron("30 2 * * *", "America/New_York")
    start, end = local_day(2026, 3, 8)

    assert fires_between(cron, start, end) == [utc(2026, 3, 8, 7)]  # 03:00 EDT
    assert cron.next_after(utc(2026, 3, 8, 7)) == utc(2026, 3, 9, 6, 30)  # 02:30 EDT again


def test_a_time_in_the_repeated_fall_back_hour_runs_once_at_its_first_occurrence() -> None:
    # 2026-11-01 in New York: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice
    cron = parse_cron("30 1 * * *", "America/New_York")
    start, end = local_day(2026, 11, 1)

    assert fires_between(cron, start, end) == [utc(2026, 11, 1, 5, 30)]  # 01:30 EDT only


def test_a_schedule_made_during_the_repeated_hour_does_not_fire_its_first_occurrence() -> None:
    # at 01:15 EST (the second 01:15), 01:30 EDT lies an hour behind: it must not be next
    cron = parse_cron("30 1 * * *", "America/New_York")

    assert cron.next_after(utc(2026, 11, 1, 6, 15)) == utc(2026, 11, 2, 6, 30)


def test_hourly_jobs_follow_real_time_through_both_changes() -> None:
    cron = parse_cron("0 * * * *", "America/New_York")

    assert len(fires_between(cron, *local_day(2026, 3, 8))) == 23
    fall = fires_between(cron, *local_day(2026, 11, 1))
    assert len(fall) == 25
    assert len(set(fall)) == 25  # never twice at one real instant


def test_nicknames_mean_their_five_field_expressions() -> None:
    assert parse_cron("@daily", "UTC").next_after(utc(2026, 5, 5, 13)) == utc(2026, 5, 6)
    assert parse_cron("@hourly", "UTC").next_after(utc(2026, 5, 5, 13, 1)) == utc(2026, 5, 5, 14)


def test_a_late_check_in_the_repeated_hour_finds_the_slots_of_that_real_hour() -> None:
    # 2026-11-01 in New York, the second 01:00-02:00 (EST) is 06:00-07:00 UTC
    cron = parse_cron("*/15 * * * *", "America/New_York")

    found = cron.latest(utc(2026, 11, 1, 6, 20), since=utc(2026, 11, 1, 5, 0), count=10)

    assert found[:2] == [utc(2026, 11, 1, 6, 15), utc(2026, 11, 1, 6, 0)]
    assert len(found) == 6  # 05:00 to 06:15 UTC: both 01:xx hours, every quarter


def test_latest_lists_the_newest_fire_times_first_within_the_window() -> None:
    cron = parse_cron("*/10 * * * *", "UTC")

    found = cron.latest(utc(2026, 1, 1, 12, 35), since=utc(2026, 1, 1, 12, 0), count=3)

    assert found == [utc(2026, 1, 1, 12, 30), utc(2026, 1, 1, 12, 20), utc(2026, 1, 1, 12, 10)]
    assert cron.latest(utc(2026, 1, 1, 12, 30), since=utc(2026, 1, 1, 12, 30), count=5) == [
        utc(2026, 1, 1, 12, 30)
    ]


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("61 * * * *", "Bad minute"),
        ("* * *", "has 3 field(s); write five"),
        ("0 0 * * * *", "has 6 field(s)"),
        ("0 0 31 2 *", "is invalid"),
        ("@fortnightly", "has 1 field(s)"),
        ("", "has 0 field(s)"),
    ],
)
def test_an_invalid_expression_is_refused_with_what_is_wrong(expression: str, says: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_cron(expression, "UTC")

    assert says in str(caught.value)
    assert "minute hour day-of-month month day-of-week" in str(caught.value)


def test_an_unknown_timezone_is_refused_with_the_closest_name() -> None:
    with pytest.raises(ScheduleError, match=r"unknown timezone 'Europe/Pariss' \(did you mean "
                                            r"'Europe/Paris'\?\); use an IANA name"):  # fmt: skip
        parse_cron("0 9 * * *", "Europe/Pariss")


def test_both_problems_are_reported_together() -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_cron("0 25 * * *", "Mars/Olympus")

    assert "Bad hour" in str(caught.value) and "unknown timezone 'Mars/Olympus'" in str(
        caught.value
    )


# -- misfire plans ---------------------------------------------------------------------------

EVERY_MINUTE = parse_cron("* * * * *", "UTC")
SLOT = utc(2026, 6, 1, 12, 0)


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_a_check_on_time_fires_the_due_slot_under_every_policy(policy: MisfirePolicy) -> None:
    result = plan_fires(
        EVERY_MINUTE, due=SLOT, now=SLOT + timedelta(seconds=0.4), policy=policy, catch_up=10,
        grace=120,
    )  # fmt: skip

    assert result.fire_at == (SLOT,)
    assert result.next_run_at == SLOT + timedelta(minutes=1)
    assert result.missed == 0


def test_once_fires_the_latest_missed_slot_after_downtime() -> None:
    now = SLOT + timedelta(minutes=30, seconds=5)

    result = plan_fires(
        EVERY_MINUTE, due=SLOT, now=now, policy=MisfirePolicy.ONCE, catch_up=10, grace=120
    )

    assert result.fire_at == (SLOT + timedelta(minutes=30),)
    assert result.missed == 30  # 31 slots passed (12:00 to 12:30), one of them runs
    assert result.next_run_at == SLOT + timedelta(minutes=31)


def test_skip_fires_nothing_older_than_the_grace_time() -> None:
    late = plan_fires(
        EVERY_MINUTE,
        due=SLOT,
        now=SLOT + timedelta(minutes=30, seconds=5),
        policy=MisfirePolicy.SKIP,
        catch_up=10,
        grace=3,
    )
    lone = plan_fires(
        EVERY_MINUTE,
        due=SLOT,
        now=SLOT + timedelta(seconds=10),
        policy=MisfirePolicy.SKIP,
        catch_up=10,
        grace=3,
    )

    assert late.fire_at == () and late.missed == 31
    assert late.next_run_at == SLOT + timedelta(minutes=31)
    assert lone.fire_at == () and lone.missed == 1  # one slot, checked after its grace


def test_skip_still_fires_the_newest_slot_when_it_is_within_the_grace_time() -> None:
    result = plan_fires(
        EVERY_MINUTE,
        due=SLOT,
        now=SLOT + timedelta(minutes=5, seconds=2),
        policy=MisfirePolicy.SKIP,
        catch_up=10,
        grace=30,
    )

    assert result.fire_at == (SLOT + timedelta(minutes=5),)
    assert result.missed == 5


def test_all_fires_each_missed_slot_oldest_first_up_to_its_cap() -> None:
    now = SLOT + timedelta(minutes=4, seconds=1)
    few = plan_fires(EVERY_MINUTE, due=SLOT, now=now, policy=MisfirePolicy.ALL, catch_up=10,
                     grace=120)  # fmt: skip
    capped = plan_fires(
        EVERY_MINUTE,
        due=SLOT,
        now=SLOT + timedelta(hours=1),
        policy=MisfirePolicy.ALL,
        catch_up=3,
        grace=120,
    )

    assert few.fire_at == tuple(SLOT + timedelta(minutes=m) for m in range(5))
    assert few.missed == 0
    assert capped.fire_at == tuple(SLOT + timedelta(hours=1, minutes=m) for m in (-2, -1, 0))
    assert capped.missed == 61 - 3
    assert capped.next_run_at == SLOT + timedelta(hours=1, minutes=1)


def test_a_long_downtime_is_planned_without_walking_every_slot() -> None:
    # a year of every-minute slots: the plan must not enumerate half a million of them
    now = SLOT + timedelta(days=365)

    result = plan_fires(
        EVERY_MINUTE, due=SLOT, now=now, policy=MisfirePolicy.ONCE, catch_up=10, grace=120
    )

    assert result.fire_at == (now,)
    assert result.missed == COUNT_LIMIT - 1  # counted up to the limit, not walked to the end
    assert result.next_run_at == now + timedelta(minutes=1)
