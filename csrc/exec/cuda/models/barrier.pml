/* The grid barrier between a rank's C channels (exec/cuda/launch.cu: step_barrier, and the
   reset as a walk's channels exit), over CALLS walks in a row, as the stream runs them: a walk's
   channels start once every channel of the one before has exited.
     arrive:  gen = generation; if fetch_add(arrived, 1) == C - 1: arrived = 0; generation++
              else wait until generation != gen, or a stop ends the wait (the walk returns)
     exit:    if fetch_add(exited, 1) == C - 1: arrived = 0; exited = 0
   In walk STOPCALL (when defined) a stop may come at any moment: a channel that sees it ends its
   walk, before its step or while it waits, so a barrier may be left half arrived. Checked: no
   channel passes step k's barrier before every channel of its walk has finished step k (unless
   it stops), every walk without a stop ends (no deadlock), and the walk after a stopped one is
   as right as the first: the exit reset leaves the barrier as the next walk needs it.
   Planted faults: FAULT_NO_EXIT_RESET drops the reset at exit; FAULT_RELEASE_BEFORE_RESET
   releases the waiters before resetting `arrived` (a released channel's next arrival is lost). */

#ifndef C
#define C 2
#endif
#ifndef STEPS
#define STEPS 2
#endif
#ifndef CALLS
#define CALLS 2
#endif

byte arrived = 0, generation = 0, exited = 0;
byte done[C];        /* steps each channel of the current walk has finished */
bool stop = false;   /* the current walk's stop word */
byte call = 0;
byte running = 0;    /* channels of the current walk that have not exited */

proctype channel(byte c) {
  byte k, gen, old, q;
  for (k : 0 .. STEPS - 1) {
    if
    :: stop -> goto out   /* the walk ends between rounds */
    :: else -> skip
    fi;
    done[c] = k + 1;
    /* the leader's barrier */
    gen = generation;
    atomic { old = arrived; arrived++ }
    if
    :: old == C - 1 ->
#ifdef FAULT_RELEASE_BEFORE_RESET
       generation++;
       arrived = 0
#else
       arrived = 0;
       generation++
#endif
    :: else ->
       do
       :: generation != gen -> break
       :: stop -> goto out
       od
    fi;
    /* passed step k's barrier: every channel has finished step k */
    for (q : 0 .. C - 1) { assert(done[q] >= k + 1) }
  }
out:
  atomic { old = exited; exited++ }
#ifndef FAULT_NO_EXIT_RESET
  if
  :: old == C - 1 -> arrived = 0; exited = 0
  :: else -> skip
  fi;
#endif
  running--
}

/* A stop in walk STOPCALL, at any moment of it. */
active proctype stopper() {
#ifdef STOPCALL
end:  /* the stop may never come: the walk may end first */
  (call == STOPCALL && running > 0);
  stop = true
#else
  skip
#endif
}

init {
  byte n, i;
  for (n : 0 .. CALLS - 1) {
    atomic {
      call = n;
      stop = false;
      for (i : 0 .. C - 1) { done[i] = 0 };
      running = C;
      for (i : 0 .. C - 1) { run channel(i) }
    };
    (running == 0)
  }
}
