"""Who may do what: bearer tokens name users; a user is either an admin or bound to the rules
of a ClusterRole (the shipped one for power-control), checked as Kubernetes' RBAC authorizer
does (apiGroups x resources[/subresource] x verbs, ``*`` matching all)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ApiError
from .resources import Resource


@dataclass(frozen=True)
class User:
    name: str
    rules: tuple[dict, ...] | None = None  # None: an admin (system:masters)

    def allowed(self, verb: str, res: Resource, sub: str) -> bool:
        if self.rules is None:
            return True
        target = f"{res.plural}/{sub}" if sub else res.plural
        for rule in self.rules:
            groups, resources, verbs = rule.get("apiGroups", []), rule.get("resources", []), rule.get("verbs", [])
            if (
                ("*" in groups or res.group in groups)
                and ("*" in resources or target in resources)
                and ("*" in verbs or verb in verbs)
            ):
                return True
        return False


def forbidden(user: User, verb: str, res: Resource, sub: str, ns: str, name: str) -> ApiError:
    what = f"{res.plural}/{sub}" if sub else res.plural
    named = f'{res.key} "{name}"' if name else res.key
    where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
    return ApiError(
        403,
        "Forbidden",
        f'{named} is forbidden: User "{user.name}" cannot {verb} resource "{what}" in API group "{res.group}"{where}',
        details={"name": name, "kind": res.plural},
    )


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def role_rules(docs: list[dict]) -> tuple[dict, ...]:
    """The rules of every ClusterRole among the documents of a manifest."""
    return tuple(r for d in docs if d and d.get("kind") == "ClusterRole" for r in d.get("rules", []))
