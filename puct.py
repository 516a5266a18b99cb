"""puct.py: the archive of measured kernels and the PUCT rule that picks parents (docs/PAPER.md §7).

search.py's kernel search keeps every successfully measured kernel in an archive. Each step it
asks this module which archive nodes to expand next. The rule is the max-reward PUCT of the paper
(inherited from TTT-Discover):

    score_i = Q_i + c * scale * P_i * sqrt(1 + T) / (1 + n_i)

    Q_i    the best reward among i's children once i has been visited (n_i > 0), else i's own
           reward r_i. Max, not mean: one fast child is what makes a kernel worth expanding again.
    P_i    a linear rank prior, (N - rank_i) / sum_j (N - rank_j), rank 0 = best reward.
    scale  max reward - min reward over the non-seed nodes (at least 1e-6; 1.0 while there are
           none), so the exploration bonus is in the same units as the rewards.
    T      expansions so far; n_i visits of i (back-propagated to every ancestor).

The reward r_i is the measured geomean speedup over the task's reference, or, for a node the search
admitted on a trusted forecast (search.py --forecast-reward), the forecast's expected speedup:
such a node is marked (measured=False), steers PUCT like any other, and is never the best kernel.
Failed candidates never enter the archive but their parent's expansion still counts as a visit. This module is separate
from search.py because it is pure arithmetic on a tree: no GPU, no LLM, no files, which is what
lets the tests check every score by hand.
"""
import math
from dataclasses import asdict, dataclass, field


@dataclass
class Node:
    id: str
    code: str
    reward: float
    parent_id: str | None = None
    is_seed: bool = False
    children: list = field(default_factory=list)
    visits: int = 0
    best_child: float | None = None  # max reward of any child kept so far (None: none yet)
    step: int = -1  # the search step that produced it (-1: the seed)
    info: dict = field(default_factory=dict)  # measurement summary, used for mutation feedback
    measured: bool = True  # False: the reward is a forecast's expected speedup, not a measurement

    def q(self):
        """Q_i: best child reward once visited, else the node's own reward."""
        if self.visits > 0 and self.best_child is not None:
            return self.best_child
        return self.reward


@dataclass
class Child:
    """A successful child offered to the archive by one expansion."""
    id: str
    code: str
    reward: float
    info: dict = field(default_factory=dict)  # measurement summary, kept on its Node
    measured: bool = True  # False: the reward is a trusted forecast's expected speedup (--forecast-reward)


class Archive:
    """Measured kernels as a tree, with PUCT parent selection.

    c: exploration constant (paper: 1.0). capacity: most nodes kept (seeds always survive, then
    the best rewards, measured before forecast ones). keep_children: of one parent's successful children in one expansion, only
    the best `keep_children` enter (TTT-Discover keeps 2), so one prolific parent cannot flood it.
    """

    def __init__(self, c=1.0, capacity=1000, keep_children=2):
        self.c, self.capacity, self.keep_children = c, capacity, keep_children
        self.nodes = {}  # id -> Node, in insertion order (ties are broken by it)
        self.expansions = 0  # T

    # ---- building the tree -----------------------------------------------------------------

    def add_seed(self, id, code, reward, info=None):
        self.nodes[id] = Node(id, code, float(reward), None, True, info=dict(info or {}))
        return self.nodes[id]

    def has_code(self, code):
        key = code.strip()
        return any(n.code.strip() == key for n in self.nodes.values())

    def expand(self, parent_id, children, step=-1):
        """Record one expansion of `parent_id` with its successful children.

        children: a list of Child. Exact duplicates of code already in the archive
        are dropped first, then only the best `keep_children` are kept: the best measured ones, and
        beside them the best forecast ones (a forecast never displaces a measured kernel). The parent's best-child
        value becomes max(old, best kept reward); the parent and every ancestor get one more visit;
        T grows by one. A parent whose children all failed (children == []) still gets its visit.
        Returns the ids that entered the archive.
        """
        parent = self.nodes.get(parent_id)
        fresh, seen = [], set()
        for child in children:
            key = child.code.strip()
            if key in seen or self.has_code(child.code):
                continue
            seen.add(key)
            fresh.append(child)
        fresh.sort(key=lambda ch: -ch.reward)  # stable: equal rewards keep proposal order
        kept = ([ch for ch in fresh if ch.measured][: self.keep_children]
                + [ch for ch in fresh if not ch.measured][: self.keep_children])
        for ch in kept:
            self.nodes[ch.id] = Node(ch.id, ch.code, ch.reward, parent_id, step=step,
                                     info=dict(ch.info or {}), measured=ch.measured)
            if parent is not None:
                parent.children.append(ch.id)
        if parent is not None and kept:
            best = max(ch.reward for ch in kept)
            parent.best_child = best if parent.best_child is None else max(parent.best_child, best)
        self._backpropagate(parent_id)
        self.expansions += 1
        self._enforce_capacity()
        return [ch.id for ch in kept]

    def _backpropagate(self, node_id):
        while node_id is not None and node_id in self.nodes:
            node = self.nodes[node_id]
            node.visits += 1
            node_id = node.parent_id

    def _enforce_capacity(self):
        if len(self.nodes) <= self.capacity:
            return
        # measured kernels outrank forecast ones: a full archive drops forecasts first
        others = sorted((n for n in self.nodes.values() if not n.is_seed), key=lambda n: (not n.measured, -n.reward))
        room = max(0, self.capacity - sum(n.is_seed for n in self.nodes.values()))
        for node in others[room:]:
            parent = self.nodes.get(node.parent_id)
            if parent is not None and node.id in parent.children:
                parent.children.remove(node.id)
            del self.nodes[node.id]

    # ---- the PUCT terms ----------------------------------------------------------------------

    def rank_prior(self):
        """P_i for every node: linear in the reward rank, summing to one."""
        order = sorted(self.nodes.values(), key=lambda n: -n.reward)  # stable on ties
        N = len(order)
        total = N * (N + 1) / 2  # sum over ranks 0..N-1 of (N - rank)
        return {n.id: (N - rank) / total for rank, n in enumerate(order)}

    def scale(self):
        rewards = [n.reward for n in self.nodes.values() if not n.is_seed]
        if not rewards:
            return 1.0
        return max(1e-6, max(rewards) - min(rewards))

    def scores(self):
        prior, scale = self.rank_prior(), self.scale()
        bonus = self.c * scale * math.sqrt(1 + self.expansions)
        return {n.id: n.q() + bonus * prior[n.id] / (1 + n.visits) for n in self.nodes.values()}

    def ancestors(self, node_id):
        out, node = set(), self.nodes.get(node_id)
        while node is not None and node.parent_id is not None:
            out.add(node.parent_id)
            node = self.nodes.get(node.parent_id)
        return out

    def descendants(self, node_id):
        out, stack = set(), [node_id]
        while stack:
            node = self.nodes.get(stack.pop())
            for cid in node.children if node else []:
                if cid not in out:
                    out.add(cid)
                    stack.append(cid)
        return out

    def select(self, batch_size):
        """Pick up to `batch_size` parents by score, best first, lineage-blocked.

        Once a node is picked, its ancestors and descendants cannot be picked in the same step, so
        one step's parents explore different branches. Fewer than batch_size come back when the
        tree has fewer independent branches (at the first step, only the seed).
        """
        scores = self.scores()
        order = sorted(self.nodes, key=lambda i: -scores[i])  # stable: insertion order on ties
        picked, blocked = [], set()
        for node_id in order:
            if len(picked) == batch_size:
                break
            if node_id in blocked:
                continue
            picked.append(node_id)
            blocked |= {node_id} | self.ancestors(node_id) | self.descendants(node_id)
        return picked

    # ---- queries and serialisation -----------------------------------------------------------

    def best(self, measured=True):
        """The node with the best reward (first on ties); by default among measured nodes only, so
        a forecast never stands for the search's result."""
        return max((n for n in self.nodes.values() if n.measured or not measured), key=lambda n: n.reward)

    def to_dict(self):
        scores = self.scores() if self.nodes else {}
        return {
            "c": self.c, "capacity": self.capacity, "keep_children": self.keep_children,
            "expansions": self.expansions,
            "nodes": [dict(asdict(n), score=scores.get(n.id)) for n in self.nodes.values()],
        }
