"""An alert when a vlcorpus build ends Failed (an unhealthy build, or an error) or Crashed (its
process died: said by its worker, or by the server once the run's heartbeats stop when the
machine died with the worker, flows/liveness.py): a Prefect automation whose action posts the
run's name, state and message to a webhook (Slack, Teams, Discord, or any service that takes a
JSON POST). Run once per Prefect server, with PREFECT_API_URL set:

    python infra/alerts.py --webhook https://hooks.slack.com/services/T000/B000/XXXX

Running it again updates the webhook and the automation in place. One failure is one alert: the
automation posts once per run, however often the server evaluates its event (flows/once.py)."""

from __future__ import annotations

import argparse

from prefect.automations import Automation
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import EventTrigger, Posture

from flows.automations import put
from flows.once import ONCE_PER_RUN

NAME = "vlcorpus-build-failed"
SUBJECT = "vlcorpus: {{ flow_run.name }} ({{ deployment.name }}) ended {{ flow_run.state.name }}"
BODY = "{{ flow_run.state.message }}"


def install(webhook: str, allow_private: bool = False) -> Automation:
    """Save the webhook block and create (or replace) the automation; returns it."""
    block = CustomWebhookNotificationBlock(
        name="vlcorpus", url=webhook, json_data={"text": "{{subject}}\n{{body}}"},
        allow_private_urls=allow_private)
    block_id = block.save(NAME, overwrite=True)
    automation = Automation(
        name=NAME,
        description="A vlcorpus build (rebuild_corpus) ended Failed or Crashed.",
        trigger=EventTrigger(
            expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
            match_related={"prefect.resource.role": "flow", "prefect.resource.name": "rebuild_corpus"},
            posture=Posture.Reactive, threshold=1, **ONCE_PER_RUN),
        actions=[SendNotification(block_document_id=block_id, subject=SUBJECT, body=BODY)],
    )
    return put(automation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--webhook", required=True, help="URL the alert is POSTed to as JSON {\"text\": ...}")
    parser.add_argument("--allow-private", action="store_true",
                        help="allow a webhook on a private address (127.0.0.1, 10.x, ...)")
    args = parser.parse_args()
    automation = install(args.webhook, args.allow_private)
    print(f"automation {automation.name} ({automation.id}): builds that end Failed or Crashed "
          f"are posted to {args.webhook}")


if __name__ == "__main__":
    main()
