/*
 * read_ahead_throttle.h - owns the decision whether read-ahead runs at all.
 *
 * Reading ahead pays only while the disk has idle time and the guesses are
 * good enough. On a saturated disk a wrong guess costs the demand reads
 * directly, and its page-cache work runs on the cores that compute: on the
 * 24-layer Qwen3-30B-A3B shape at a 25% budget, gate made decode 13% slower
 * and pilot 3% (bench/PIPELINE.md). No model of disk and cores predicts that
 * across machines, so the throttle measures instead. It runs ubatches in
 * epochs, each with read-ahead on or off, keeps a running time per token
 * for both, runs the faster one, and gives the other one epoch in every
 * `explore_every` so that a change (a quieter disk, a colder cache) is seen.
 * Until both are measured it runs the side it starts with, except for one
 * early epoch of the other: decode starts off, because its guesses lost where
 * they were measured; prompts start on, because a prompt's whole-layer
 * read-ahead is no guess and gained 24-52% (bench/PIPELINE.md). Either way
 * the side that loses gets one epoch in explore_every, which bounds what it
 * costs. A side's first epoch is a warm-up: the first ubatches of a run are
 * cold (the policy and the page cache are still filling), so the side's
 * second epoch replaces it instead of averaging with it. Averaged, a cold
 * first decode epoch could keep read-ahead on for dozens of epochs whatever
 * it cost (test_predictor). The cache can take longer than that to fill, so
 * the start side runs again right after the first exploration, and that
 * epoch, the nearest in time, is what the exploration is judged against: on
 * the model's own routing, gate was kept on after a 64-token prompt because
 * off's first two epochs (148 ms per token) were colder than its later ones
 * (78-83 ms), against gate's 93.
 *
 * Exploring is what a losing side costs, so it is cut twice over. An
 * exploration whose first two ubatches each take a quarter longer than the
 * side run ends there: gate lost 40-50% per token on the model's own
 * routing, and a whole epoch of that is 5% of a 32-token run. And each
 * exploration that leaves the choice as it was doubles the gap to the next
 * (up to GUANACO_THROTTLE_MAX_EXPLORE_GAP epochs); a change of choice resets
 * it. The side run is measured all the time, so a change that slows it is
 * seen at once; only a change that makes the other side pay waits for the
 * next exploration.
 *
 * Pure like the predictors: the caller passes each ubatch's time in; no
 * clock, no I/O, no globals, no allocation. Not thread-safe.
 */
#ifndef GUANACO_READ_AHEAD_THROTTLE_H
#define GUANACO_READ_AHEAD_THROTTLE_H

#include <stdbool.h>
#include <stdint.h>

/* Most ubatches in one epoch: an epoch's time per token is the median of its ubatches'. */
#define GUANACO_THROTTLE_MAX_EPOCH 16u

/* Decode: 4 single-token ubatches show a 10% difference through the noise of a shared machine, and one
   epoch in 8 spent on the losing side bounds the loss to an eighth of the difference (less as the gap
   widens). The other side is tried early, in the third epoch: waiting for the eighth kept a read-ahead that
   paid 8-9% off for 28 of llama-bench's 64 tokens (bench/PIPELINE.md). Not in the second: off's second
   epoch is its first warm one, and an exploration can be cut short only against a warm estimate. */
#define GUANACO_THROTTLE_DECODE_EPOCH 4u
#define GUANACO_THROTTLE_DECODE_EXPLORE_EVERY 8u
#define GUANACO_THROTTLE_DECODE_FIRST_EXPLORE 2u
/* Prompts: a ubatch takes seconds and comes a few at a time, so each one is an epoch, and the other side
   waits for the eighth: a 1024-token prompt is two ubatches, and reading ahead gained 24-52% on each. */
#define GUANACO_THROTTLE_PROMPT_EPOCH 1u
#define GUANACO_THROTTLE_PROMPT_EXPLORE_EVERY 8u
#define GUANACO_THROTTLE_PROMPT_FIRST_EXPLORE 7u
/* Read-ahead must be this much faster than off to be chosen: a tie goes to off, which wastes nothing. */
#define GUANACO_THROTTLE_MARGIN 0.02
/* An exploration ends after two ubatches that each took this much longer per token than the side run's
   estimate: a quarter is beyond a decode token's spread on a shared machine, and a side that loses that much
   has nothing to show in two more. */
#define GUANACO_THROTTLE_ABORT_RATIO 1.25
/* The widest gap between explorations, in epochs: a side that loses 45% then costs 1.4% of a long run. */
#define GUANACO_THROTTLE_MAX_EXPLORE_GAP 32u

struct guanaco_read_ahead_throttle {
    uint32_t epoch_ubatches, explore_every;
    uint32_t first_explore;       /* the epoch that first runs the other side */
    bool enabled;                 /* false: read-ahead always on (--guanaco-prefetch-throttle off) */
    bool start_on;                /* the side run until both are measured */
    bool on;                      /* what the current epoch runs */
    uint32_t in_epoch;            /* ubatches of the current epoch measured so far */
    double times[GUANACO_THROTTLE_MAX_EPOCH]; /* their ns per token */
    uint64_t epochs;              /* epochs finished */
    double estimate[2];           /* ns per token with read-ahead off [0] and on [1]; 0 = not measured yet */
    uint64_t ubatches[2];         /* ubatches measured off and on */
    uint64_t side_epochs[2];      /* epochs measured off and on */
    bool exploring;               /* the current epoch runs the side that is not the best */
    uint64_t explore_gap;         /* epochs from one exploration to the next: explore_every, doubling */
    uint64_t next_explore;        /* the epoch of the next exploration */
    uint64_t explorations_cut;    /* explorations ended after two ubatches */
};

/* epoch_ubatches from 1 to GUANACO_THROTTLE_MAX_EPOCH, explore_every from 2 to
   GUANACO_THROTTLE_MAX_EXPLORE_GAP, first_explore from 1 to explore_every - 1. 0 or -EINVAL. */
int guanaco_read_ahead_throttle_init(struct guanaco_read_ahead_throttle *t, bool enabled, bool start_on,
                                     uint32_t epoch_ubatches, uint32_t explore_every, uint32_t first_explore);

/* Whether the next ubatch reads ahead. A ubatch keeps the answer it started with. */
bool guanaco_read_ahead_throttle_allows(const struct guanaco_read_ahead_throttle *t);

/* One ubatch ran `tokens` tokens in `ns` nanoseconds with read-ahead `was_on` (what allows() said when it
   started: with several contexts another ubatch may have ended the epoch meanwhile). Ignores empty ones. */
void guanaco_read_ahead_throttle_observe(struct guanaco_read_ahead_throttle *t, bool was_on, uint64_t tokens,
                                         uint64_t ns);

/* Whether read-ahead is the faster side on what has been measured so far. */
bool guanaco_read_ahead_throttle_prefers_on(const struct guanaco_read_ahead_throttle *t);

#endif
