/* The call words: a seqlock through which a walker tells a peer which call it is in
   (exec/step_walker.h: "call"; the writer is channel 0's leader as a walk starts, the reader a
   peer's leader with nothing to do, in peer_in_another_call).
     writer, for each call k:   seq = 0; tag = T(k); seq = k + 1
     reader, in its call j:     s1 = seq; if s1 == j + 1: t = tag; s2 = seq;
                                if s2 == j + 1 and t != its own tag: a mismatch
   Both ranks make the same CALLS calls (T(k) = k % 2 + 1, so consecutive calls differ, as an
   all_reduce after a broadcast does): the reader must never find a mismatch, whichever call
   each is in. With MISMATCH defined, the writer's call MISMATCH has another tag and the writer
   stays in it (it waits for chunks that never come); the reader in that call must find the
   mismatch once the writer's words are written, and nowhere else.
   Planted faults: FAULT_NO_CLEAR leaves seq alone while the tag changes (a reader a call behind
   pairs the old seq with the new tag); FAULT_ONE_READ trusts s1 without reading seq again. */

#ifndef CALLS
#define CALLS 3
#endif

#define T(k) ((k) % 2 + 1)

byte seq = 0, tag = 0;
bool found = false;
byte writer_in = 0;   /* the call the writer's walk is in (for the MISMATCH check) */

active proctype writer() {
  byte k;
  for (k : 0 .. CALLS - 1) {
    writer_in = k;
#ifndef FAULT_NO_CLEAR
    seq = 0;
#endif
#ifdef MISMATCH
    if
    :: k == MISMATCH -> tag = 9
    :: else -> tag = T(k)
    fi;
#else
    tag = T(k);
#endif
    seq = k + 1;
#ifdef MISMATCH
    if
    :: k == MISMATCH -> (found)   /* stays in its call (it waits for chunks that never come) */
    :: else -> skip
    fi
#endif
  }
}

active proctype reader() {
  byte j, s1, s2, t;
  for (j : 0 .. CALLS - 1) {
#ifdef MISMATCH
    if
    :: j == MISMATCH -> (seq == j + 1)   /* it looks until the writer's words are there */
    :: else -> skip
    fi;
#endif
    do
    :: s1 = seq;
       if
       :: s1 == j + 1 ->
          t = tag;
#ifdef FAULT_ONE_READ
          s2 = s1;
#else
          s2 = seq;
#endif
          if
          :: s2 == j + 1 && t != T(j) ->
#ifdef MISMATCH
             assert(j == MISMATCH);
             found = true;
             goto done
#else
             assert(false)   /* a mismatch between identical calls */
#endif
          :: else -> skip
          fi
       :: else -> skip
       fi;
#ifdef MISMATCH
       assert(j != MISMATCH)   /* one look at a writer that stays must find it */
#endif
#ifdef MISMATCH
    :: j != MISMATCH -> break   /* the call ends (its chunks arrived); the mismatched one never */
#else
    :: break   /* the call ends (its chunks arrived) */
#endif
    od
  }
done:
  skip
}
