"""Traffic-skeleton inference: the endpoint pairs a training job really uses (paper §5.1,
DESIGN §5), from each RNIC's byte counters over a few minutes.

Why it works: every gradient synchronisation is a burst on every RNIC of a DP group at the same
moment, pipeline stages burst one after another (the backward pass reaches them in turn),
collectives stay on their rail, and between two syncs each DP replica runs its own pipeline, so
its sends and receives carry its own timing. So, per rail, the RNICs fall into equal-size groups
(one per PP stage) of identical burst timing, ordered by their time shift; the skeleton of an
RNIC is its group (DP peers) plus the RNIC of its own replica in each adjacent group (PP
neighbours), found by that timing.

The stages (the paper gives no STFT window, hop, distance or linkage; these are ours):

1. **Spectrum** (:mod:`.spectrum`): the iteration period (autocorrelation peak of the RNIC-averaged
   power spectrum) and each RNIC's burst regime (64 s Hann STFT, 16 s hop, correlation distance of
   its log-magnitude spectrogram to the job's median one).
2. **Shift and stage split** (:mod:`.stages`): each RNIC's lag against a job template within a
   quarter period, below a sample by a parabola; equal groups cut at real gaps (wider than the
   groups' own spread), per host when a host's RNICs share one shift (sharper), per rail
   otherwise, or the rank hint's stage blocks when the shifts confirm them. Constrained as Eq. 1–3:
   equal group sizes, the size divides N, no two RNICs of a host in a group (one RNIC per host and
   rail is checked up front). Merging stages only lengthens the list; splitting a DP group would
   miss pairs, so a boundary needs a clear gap.
3. **Grouping**: DP peers are every ordered pair inside a group.
4. **Partner pairing** (:mod:`.partners`): per stage boundary (and from the last stage back to the
   first, which interleaved 1F1B uses and burst shifts cannot rule out), each replica's *timing
   fingerprint* — its offsets from its group's mean per window — pairs the RNICs of one replica
   across the boundary by assignment, pooled over rails of the same hosts; a rank hint is a prior
   that lowers the bar for its own partner but must be confirmed, and is dropped where the
   traffic names another partner. Rows without clear evidence keep the whole adjacent group.
   A job without data parallelism (one replica: every rail one group, no collective) is
   ordered instead by its hosts' idle gaps (:mod:`.chain`): each iteration's pipeline fill and
   drain lengthen a host's gap by a forward and a backward per stage down the pipeline; each
   host's partners are its neighbours in that order, when every step is clear.
5. **Validation** (:mod:`.validate`): each RNIC's correlation with its group's other members
   (coherence), the clarity of the split, agreement of the rails, typical STFT regimes, and a scan
   of the residual correlation of same-rail pairs outside the skeleton (a strong one is a missed
   pair: it is added; many mean the structure does not explain the traffic).

The confidence is the weakest of the validation scores. Below ``min_confidence``, or when the
evidence cannot fit (too little traffic yet, no common bursts as in debug jobs, hosts binding
different rails as with containers of fewer than 8 RNICs on different halves), the result keeps
a safe superset — the same-rail list or, if a peer may sit on another rail, every cross-host pair
of the job — and says why. A missed used pair is worse than a longer list: coverage never falls
silently, and the reason says what made the list grow.

Sampling: the method takes any rate (``sample_hz``). Stage shifts are a backward pass apart
(~0.1–1 s) and resolve at 1 Hz over many bursts, but a replica's timing offsets are tens of
milliseconds: at 1 Hz they show only in strong stragglers, at 10 Hz in most windows (see
``bench/skeleton.py``).

Cost per job is a few FFTs per RNIC plus, per rail, sorting and an O(g²) assignment per stage
boundary; the O(n²) scan for missed pairs is limited to rails of ``missed_scan_max`` RNICs.
"""

from skh.analysis.skeleton.infer import infer_skeleton, traffic_changed
from skh.analysis.skeleton.model import (
    MODE_GROUP_WIDE,
    MODE_SAME_RAIL,
    MODE_SKELETON,
    Skeleton,
    SkeletonParams,
    pairs_coverage,
)

__all__ = [
    "MODE_GROUP_WIDE",
    "MODE_SAME_RAIL",
    "MODE_SKELETON",
    "Skeleton",
    "SkeletonParams",
    "infer_skeleton",
    "pairs_coverage",
    "traffic_changed",
]
