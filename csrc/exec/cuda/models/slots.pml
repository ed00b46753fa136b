/* Slot message passing through `posted`, and slot reuse through `consumed`, as the step walker
   does it (exec/step_walker.h: "counters"; exec/cuda/launch.cu: published(), load(), store()).

   P ranks in a ring; each sends MSGS messages to the next rank and receives MSGS from the
   previous one, through SLOTS slots per lane. A message is two data words (a torn or stale read
   shows as a word that does not hold the message's number) and a header (the call's tag).
     sender:   wait until sent - consumed < SLOTS; write the slot's words and header;
               [fence] posted = sent + 1
     receiver: wait until posted > received; read the header and the words;
               [fence] consumed = received + 1
   Checked: every word a receiver reads is the message it expects (no stale read, no overwrite
   of an unread slot), and no rank is left waiting (SPIN's invalid end states: deadlock). As the
   walker, a rank moves whichever of its send and receive can move, and waits only when neither
   can.
   Planted faults (each must be found): FAULT_PUBLISH_EARLY posts before writing the data;
   FAULT_NO_CONSUMED_WAIT writes without waiting for a free slot; FAULT_CONSUME_EARLY frees the
   slot before reading it. SPIN interleaves statements (sequential consistency): what the
   fences buy on a weaker model is argued in launch.cu, not here. */

#ifndef P
#define P 2
#endif
#ifndef SLOTS
#define SLOTS 1
#endif
#ifndef MSGS
#define MSGS 3
#endif

#define TAG 7

/* lane q: from rank q to rank (q + 1) % P, in the receiver's memory */
byte w0[P * SLOTS], w1[P * SLOTS], hdr[P * SLOTS];
byte posted[P], consumed[P];

proctype rank(byte r) {
  byte out = r;                  /* lane this rank sends on */
  byte in = (r + P - 1) % P;     /* lane this rank receives on */
  byte sent = 0, received = 0, slot, a, b, h;
  do
  :: sent < MSGS || received < MSGS ->
     if
#ifndef FAULT_NO_CONSUMED_WAIT
     :: sent < MSGS && sent - consumed[out] < SLOTS ->
#else
     :: sent < MSGS ->
#endif
        slot = out * SLOTS + sent % SLOTS;
#ifdef FAULT_PUBLISH_EARLY
        posted[out] = sent + 1;
#endif
        w0[slot] = sent + 1;
        hdr[slot] = TAG;
        w1[slot] = sent + 1;
#ifndef FAULT_PUBLISH_EARLY
        posted[out] = sent + 1;
#endif
        sent++
     :: received < MSGS && posted[in] > received ->
        slot = in * SLOTS + received % SLOTS;
#ifdef FAULT_CONSUME_EARLY
        consumed[in] = received + 1;
#endif
        h = hdr[slot];
        a = w0[slot];
        b = w1[slot];
        assert(h == TAG && a == received + 1 && b == received + 1);
#ifndef FAULT_CONSUME_EARLY
        consumed[in] = received + 1;
#endif
        received++
     fi
  :: else -> break
  od
}

init {
  byte r;
  atomic {
    for (r : 0 .. P - 1) { run rank(r) }
  }
}
