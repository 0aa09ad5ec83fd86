/*
 * read_ahead_throttle.c - owns the measured on/off decision for read-ahead
 * (the why is in read_ahead_throttle.h): epochs, their medians, the two
 * running estimates and the exploration schedule.
 */
#include "read_ahead_throttle.h"

#include <errno.h>
#include <string.h>

int guanaco_read_ahead_throttle_init(struct guanaco_read_ahead_throttle *t, bool enabled, bool start_on,
                                     uint32_t epoch_ubatches, uint32_t explore_every, uint32_t first_explore) {
    if (!t || epoch_ubatches == 0 || epoch_ubatches > GUANACO_THROTTLE_MAX_EPOCH || explore_every < 2 ||
        explore_every > GUANACO_THROTTLE_MAX_EXPLORE_GAP || first_explore == 0 || first_explore >= explore_every) {
        return -EINVAL;
    }
    memset(t, 0, sizeof(*t));
    t->enabled = enabled;
    t->epoch_ubatches = epoch_ubatches;
    t->explore_every = explore_every;
    t->first_explore = first_explore;
    t->start_on = start_on;
    t->on = !enabled || start_on;
    t->explore_gap = explore_every;
    t->next_explore = first_explore;
    return 0;
}

bool guanaco_read_ahead_throttle_allows(const struct guanaco_read_ahead_throttle *t) {
    return !t->enabled || t->on;
}

bool guanaco_read_ahead_throttle_prefers_on(const struct guanaco_read_ahead_throttle *t) {
    const double off = t->estimate[0], on = t->estimate[1];
    return on > 0.0 && off > 0.0 && on < off * (1.0 - GUANACO_THROTTLE_MARGIN);
}

/* Median, not mean: a status line's mincore audit or another process's burst lands in one ubatch. */
static double epoch_median(struct guanaco_read_ahead_throttle *t) {
    for (uint32_t i = 1; i < t->in_epoch; i++) {
        double v = t->times[i];
        uint32_t j = i;
        for (; j > 0 && t->times[j - 1] > v; j--) {
            t->times[j] = t->times[j - 1];
        }
        t->times[j] = v;
    }
    uint32_t n = t->in_epoch;
    return n % 2 ? t->times[n / 2] : 0.5 * (t->times[n / 2 - 1] + t->times[n / 2]);
}

void guanaco_read_ahead_throttle_observe(struct guanaco_read_ahead_throttle *t, bool was_on, uint64_t tokens,
                                         uint64_t ns) {
    if (tokens == 0 || ns == 0) {
        return;
    }
    t->ubatches[was_on]++;
    if (was_on != t->on) {
        return; /* began in the previous epoch: it would blur this one */
    }
    t->times[t->in_epoch++] = (double)ns / (double)tokens;
    const double run_side = t->estimate[!t->on];
    const bool clearly_losing = t->exploring && t->in_epoch == 2 && run_side > 0.0 &&
                                t->times[0] > GUANACO_THROTTLE_ABORT_RATIO * run_side &&
                                t->times[1] > GUANACO_THROTTLE_ABORT_RATIO * run_side;
    t->explorations_cut += clearly_losing;
    if (t->in_epoch < t->epoch_ubatches && !clearly_losing) {
        return;
    }
    double value = epoch_median(t);
    double *estimate = &t->estimate[t->on];
    /* halves: the estimate follows a change in the machine within a few epochs of that side. Until the
       epoch after the first exploration the run is still warming (its cache filling), so there the newest
       epoch replaces the estimate: the start side is judged by the epoch that follows the exploration,
       the nearest in time, and any side's second epoch replaces its first. */
    bool warming = t->side_epochs[t->on] < 2 || (t->on == t->start_on && t->epochs <= t->first_explore + 1);
    *estimate = warming ? value : 0.5 * *estimate + 0.5 * value;
    t->side_epochs[t->on]++;
    t->in_epoch = 0;
    t->epochs++;
    if (!t->enabled) {
        return;
    }
    /* Until both sides are measured the start side counts as the faster. */
    bool measured = t->estimate[0] > 0.0 && t->estimate[1] > 0.0;
    bool best = measured ? guanaco_read_ahead_throttle_prefers_on(t) : t->start_on;
    const uint64_t finished = t->epochs - 1;
    if (t->exploring) {
        /* the exploration's verdict: the same choice widens the gap, a new one starts it over */
        bool same = best != t->on;
        uint64_t wider = 2 * t->explore_gap;
        t->explore_gap = !same ? t->explore_every
                         : wider < GUANACO_THROTTLE_MAX_EXPLORE_GAP ? wider : GUANACO_THROTTLE_MAX_EXPLORE_GAP;
        t->next_explore = finished + t->explore_gap;
    } else if (measured && best != t->on && finished > t->first_explore) {
        /* the side run got slower than the other's estimate: a new choice, the gap starts over */
        t->explore_gap = t->explore_every;
        t->next_explore = finished + t->explore_gap;
    }
    bool explore = t->epochs == t->next_explore;
    t->on = explore ? !best : best;
    t->exploring = explore;
    if (t->epochs == t->first_explore + 1) {
        t->on = t->start_on; /* measured again, beside the exploration in time, before choosing */
        t->exploring = false;
    }
}
