"""The offline tasks as a setting: importing this module registers the demo (dataset ``demo``, reward
``allowed_letters``) and ``strict_letters`` (dataset, reward with its answer check, evaluation task). The registries
import it on their first lookup (``sharpgrpo.settings``)."""

from sharpgrpo.data.demo import register_demo
from sharpgrpo.tasks.strict_letters import register_strict_letters

register_demo()
register_strict_letters()
