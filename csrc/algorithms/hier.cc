// Hierarchical (topology-aware) schedules: the slow links between hosts carry each byte once per
// host instead of once per rank, and every rank of a host drives its own share of that traffic.
//
// Terms (Topology in schedule.h): G hosts; host h holds L_h ranks, local indices 0 .. L_h-1.
//   S        columns = the smallest host's L (min L_h). Every host has a local rank of each index
//            below S, so column c has one owner per host: its local rank c (the counterparts).
//   column   a contiguous range of the working buffer; column c crosses hosts only between its
//            owners. all_reduce cuts its buffer into S even columns. reduce_scatter and
//            all_gather work on a packed copy in scratch where the blocks of column c's ranks
//            (rank q is in column local(q) mod S) are contiguous, host by host, so that a host's
//            share of a column is one range too.
//   piece    inside a host, column c is cut evenly among the local ranks j with j mod S == c
//            (piece j div S goes to local rank j): every local rank has one piece, the pieces
//            tile the buffer, and on a host with L_h == S a piece is a whole column. On larger
//            hosts the ranks j >= S hand their piece to the owner (local j mod S) before the
//            inter-host phase and get it back after: how uneven hosts map onto S columns.
//   round    all_to_all's inter-host exchange: in round k (0 .. G-2) host h sends to host
//            h+k+1 and receives from host h-k-1 (mod G); local rank k mod L_h of each host
//            aggregates, sends, receives and distributes round k's message.
//
// all_reduce   = intra-host ring reduce-scatter of the pieces (input -> output), pieces to their
//                column owners, inter-host all_reduce of column c among its owners (ring:
//                reduce-scatter + all-gather in place; HierTree: pipelined binary tree, reduce to
//                host 0's owner then broadcast), pieces back, intra-host ring all-gather. Every
//                element is reduced once, on one chain of ranks, and copied from there: all
//                ranks get identical bits.
// reduce_scatter = pack, intra-host ring reduce-scatter of the pieces, pieces to owners,
//                inter-host ring reduce-scatter of column c (host g's share to host g's owner),
//                each block from its owner to its rank.
// all_gather   = every block to its column owner (packed), inter-host ring all-gather of the
//                column, pieces to the other local ranks, intra-host ring all-gather, unpack.
// broadcast / reduce = a pipelined tree whose top is a tree of host leaders (chain for Hier,
//                binary for HierTree; the root leads its host, local rank 0 the others) and
//                whose leaders head a binary tree of their host's ranks.
// all_to_all   = intra-host pairwise exchange; then per remote host: each rank packs its blocks
//                by destination host, hands them to the round's aggregator, which sends one
//                message per host pair; the receiving host's rank of that round hands every
//                local rank its part, which it unpacks.
// Every op is a message op or a local copy, so every executor that walks schedules runs them.
#include <algorithm>
#include <functional>
#include "algorithms/op_builders.h"
#include "algorithms/tree.h"
#include "common/check.h"

namespace ringtree {

int Topology::min_local() const {
  int m = nranks();
  for (const auto& h : hosts) m = std::min<int>(m, static_cast<int>(h.size()));
  return m;
}

int Topology::max_local() const {
  int m = 0;
  for (const auto& h : hosts) m = std::max<int>(m, static_cast<int>(h.size()));
  return m;
}

Topology Topology::from_labels(const std::vector<int64_t>& labels) {
  RT_CHECK(!labels.empty(), InvalidArgument, "a topology needs at least one rank");
  Topology t;
  const int P = static_cast<int>(labels.size());
  t.host_of.assign(P, -1);
  t.local_index.assign(P, 0);
  for (int r = 0; r < P; ++r) {
    if (t.host_of[r] >= 0) continue;
    const int h = t.num_hosts();
    t.hosts.emplace_back();
    for (int q = r; q < P; ++q)
      if (labels[q] == labels[r]) {
        t.host_of[q] = h;
        t.local_index[q] = static_cast<int>(t.hosts[h].size());
        t.hosts[h].push_back(q);
      }
  }
  return t;
}

std::string Topology::describe() const {
  std::string out = str_cat(num_hosts(), num_hosts() == 1 ? " host:" : " hosts:");
  for (const auto& h : hosts) {
    out += " {";
    for (size_t i = 0; i < h.size(); ++i) out += str_cat(i ? "," : "", h[i]);
    out += "}";
  }
  return out;
}

std::vector<Algo> hier_algos(Collective coll) {
  switch (coll) {
    case Collective::AllReduce:
    case Collective::Broadcast:
    case Collective::Reduce:
      return {Algo::Hier, Algo::HierTree};
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll:
      return {Algo::Hier};
    default:
      return {};
  }
}

namespace {

struct Range {
  uint64_t offset = 0, length = 0;
};

// Part i of n even parts of `whole` (the first whole.length % n one element longer).
Range part(Range whole, int n, int i) {
  const uint64_t base = whole.length / n, extra = whole.length % n, ui = static_cast<uint64_t>(i);
  return {whole.offset + ui * base + std::min(ui, extra), base + (ui < extra ? 1 : 0)};
}

// One rank's view of the hosts.
struct Place {
  const Topology& t;
  int rank, host, local, G, S;
  const std::vector<int>& members;  // this host's ranks
  int L() const { return static_cast<int>(members.size()); }
  Place(const Topology& topo, int r)
      : t(topo),
        rank(r),
        host(topo.host_of[r]),
        local(topo.local_index[r]),
        G(topo.num_hosts()),
        S(topo.min_local()),
        members(topo.hosts[topo.host_of[r]]) {}
  // The owners of column c, one per host, in host order.
  std::vector<int> owners(int c) const {
    std::vector<int> out;
    for (const auto& h : t.hosts) out.push_back(h[c]);
    return out;
  }
};

// Where a phase reads and writes: one buffer, offsets of the layout shifted by `base`.
struct Area {
  BufId buf;
  uint64_t base = 0;
};

// A working buffer cut into S columns, and the pieces of host h.
struct Layout {
  std::vector<Range> columns;
  // Piece of local index j on a host of L ranks.
  Range piece(int S, int L, int j) const {
    const int c = j % S;
    const int sharing = (L - 1 - c) / S + 1;  // local indices c, c+S, c+2S, ... below L
    return part(columns[c], sharing, j / S);
  }
  std::vector<Range> pieces(int S, int L) const {
    std::vector<Range> out;
    for (int j = 0; j < L; ++j) out.push_back(piece(S, L, j));
    return out;
  }
};

// Ring reduce-scatter among `group` (this rank is group[me]) of blocks[i] (one per member, any
// sizes): step s sends the partial of block me-s-1 (step 0: straight from src) to the next
// member and reduces the partial of block me-s-2 from the previous one with src into acc.
// Afterwards acc holds the group's reduction of block me. src may be acc (in place).
void ring_reduce_scatter_among(Schedule& s, const std::vector<int>& group, int me, const std::vector<Range>& blocks,
                               Area src, Area acc) {
  const int n = static_cast<int>(group.size());
  if (n == 1) {
    if (src.buf != acc.buf || src.base != acc.base)
      s.add(make_copy(acc.buf, acc.base + blocks[0].offset, src.buf, src.base + blocks[0].offset, blocks[0].length));
    s.end_step();
    return;
  }
  const int next = group[ring_mod(me + 1, n)], prev = group[ring_mod(me - 1, n)];
  for (int step = 0; step < n - 1; ++step) {
    const Range out = blocks[ring_mod(me - step - 1, n)], in = blocks[ring_mod(me - step - 2, n)];
    const Area from = step == 0 ? src : acc;
    s.add(make_send(next, from.buf, from.base + out.offset, out.length));
    s.add(make_recv_reduce(prev, acc.buf, acc.base + in.offset, src.buf, src.base + in.offset, in.length));
    s.end_step();
  }
}

// Ring all-gather among `group` of blocks[i], in `area`, where member i holds block i: step s
// forwards block me-s and receives block me-s-1.
void ring_all_gather_among(Schedule& s, const std::vector<int>& group, int me, const std::vector<Range>& blocks,
                           Area area) {
  const int n = static_cast<int>(group.size());
  const int next = group[ring_mod(me + 1, n)], prev = group[ring_mod(me - 1, n)];
  for (int step = 0; step < n - 1; ++step) {
    const Range out = blocks[ring_mod(me - step, n)], in = blocks[ring_mod(me - step - 1, n)];
    s.add(make_send(next, area.buf, area.base + out.offset, out.length));
    s.add(make_recv(prev, area.buf, area.base + in.offset, in.length));
    s.end_step();
  }
}

// Pieces of local ranks j >= S to their column owner (to_owner) or back (from the owner).
void move_pieces(Schedule& s, const Place& p, const Layout& lay, Area area, bool to_owner) {
  const int L = p.L(), S = p.S;
  if (p.local >= S) {
    const Range mine = lay.piece(S, L, p.local);
    const int owner = p.members[p.local % S];
    s.add(to_owner ? make_send(owner, area.buf, area.base + mine.offset, mine.length)
                   : make_recv(owner, area.buf, area.base + mine.offset, mine.length));
  } else {
    for (int j = p.local + S; j < L; j += S) {
      const Range theirs = lay.piece(S, L, j);
      s.add(to_owner ? make_recv(p.members[j], area.buf, area.base + theirs.offset, theirs.length)
                     : make_send(p.members[j], area.buf, area.base + theirs.offset, theirs.length));
    }
  }
  s.end_step();
}

void hier_all_reduce(Schedule& s, const Place& p, const ScheduleKey& k) {
  Layout lay;
  for (int c = 0; c < p.S; ++c) lay.columns.push_back(part({0, k.count}, p.S, c));
  const Area in{BufId::Input}, out{BufId::Output};
  // intra-host reduce-scatter: this rank's piece, summed over its host, in the output
  ring_reduce_scatter_among(s, p.members, p.local, lay.pieces(p.S, p.L()), in, out);
  move_pieces(s, p, lay, out, /*to_owner=*/true);
  // inter-host all_reduce of column `local` among its owners, in place in the output
  if (p.local < p.S && p.G > 1) {
    const Range column = lay.columns[p.local];
    const std::vector<int> owners = p.owners(p.local);
    if (k.algo == Algo::HierTree) {
      const TreeNode hosts = tree_node(p.G, p.host, 0, 2);
      TreeNode node;
      node.parent = hosts.parent < 0 ? -1 : owners[hosts.parent];
      for (int child : hosts.children) node.children.push_back(owners[child]);
      tree_reduce_over(s, node, column.offset, column.length, k.segment, BufId::Output, BufId::Output);
      tree_broadcast_over(s, node, column.offset, column.length, k.segment, BufId::Output);
    } else {
      std::vector<Range> blocks;
      for (int g = 0; g < p.G; ++g) blocks.push_back(part(column, p.G, g));
      ring_reduce_scatter_among(s, owners, p.host, blocks, out, out);
      ring_all_gather_among(s, owners, p.host, blocks, out);
    }
  }
  move_pieces(s, p, lay, out, /*to_owner=*/false);
  ring_all_gather_among(s, p.members, p.local, lay.pieces(p.S, p.L()), out);
}

// reduce_scatter's and all_gather's packed order: ranks by (column, host, local index); block q
// sits at packed slot slot[q]. columns and shares (host g's part of column c) as ranges of N.
struct Packing {
  std::vector<uint64_t> slot;              // per rank
  Layout lay;                              // columns in elements
  std::vector<std::vector<Range>> shares;  // [column][host]
};

Packing pack_order(const Place& p, uint64_t N) {
  Packing pk;
  pk.slot.assign(p.t.nranks(), 0);
  pk.shares.assign(p.S, std::vector<Range>(p.G));
  uint64_t next = 0;
  for (int c = 0; c < p.S; ++c) {
    const uint64_t column_begin = next;
    for (int g = 0; g < p.G; ++g) {
      const uint64_t share_begin = next;
      const std::vector<int>& host = p.t.hosts[g];
      for (size_t j = c; j < host.size(); j += p.S) pk.slot[host[j]] = next++;
      pk.shares[c][g] = {share_begin * N, (next - share_begin) * N};
    }
    pk.lay.columns.push_back({column_begin * N, (next - column_begin) * N});
  }
  return pk;
}

void hier_reduce_scatter(Schedule& s, const Place& p, const ScheduleKey& k) {
  const uint64_t N = k.count, P = static_cast<uint64_t>(p.t.nranks());
  const Packing pk = pack_order(p, N);
  const Area work{BufId::Scratch};
  s.scratch_elems = P * N;
  for (uint64_t q = 0; q < P; ++q) s.add(make_copy(BufId::Scratch, pk.slot[q] * N, BufId::Input, q * N, N));
  s.end_step();
  ring_reduce_scatter_among(s, p.members, p.local, pk.lay.pieces(p.S, p.L()), work, work);
  move_pieces(s, p, pk.lay, work, /*to_owner=*/true);
  if (p.local < p.S) ring_reduce_scatter_among(s, p.owners(p.local), p.host, pk.shares[p.local], work, work);
  // each block from its owner (the local rank of its column) to its rank
  const int owner = p.members[p.local % p.S];
  if (owner == p.rank) {
    for (size_t j = p.local; j < p.members.size(); j += p.S) {
      const int q = p.members[j];
      if (q == p.rank)
        s.add(make_copy(BufId::Output, 0, BufId::Scratch, pk.slot[q] * N, N));
      else
        s.add(make_send(q, BufId::Scratch, pk.slot[q] * N, N));
    }
  } else {
    s.add(make_recv(owner, BufId::Output, 0, N));
  }
  s.end_step();
}

void hier_all_gather(Schedule& s, const Place& p, const ScheduleKey& k) {
  const uint64_t N = k.count, P = static_cast<uint64_t>(p.t.nranks());
  const Packing pk = pack_order(p, N);
  const Area work{BufId::Scratch};
  s.scratch_elems = P * N;
  // each block to its column owner on its host
  const int owner = p.members[p.local % p.S];
  if (owner == p.rank) {
    for (size_t j = p.local; j < p.members.size(); j += p.S) {
      const int q = p.members[j];
      if (q == p.rank)
        s.add(make_copy(BufId::Scratch, pk.slot[q] * N, BufId::Input, 0, N));
      else
        s.add(make_recv(q, BufId::Scratch, pk.slot[q] * N, N));
    }
  } else {
    s.add(make_send(owner, BufId::Input, 0, N));
  }
  s.end_step();
  if (p.local < p.S) ring_all_gather_among(s, p.owners(p.local), p.host, pk.shares[p.local], work);
  move_pieces(s, p, pk.lay, work, /*to_owner=*/false);
  ring_all_gather_among(s, p.members, p.local, pk.lay.pieces(p.S, p.L()), work);
  for (uint64_t q = 0; q < P; ++q) s.add(make_copy(BufId::Output, q * N, BufId::Scratch, pk.slot[q] * N, N));
  s.end_step();
}

// The tree of broadcast and reduce: host leaders in a tree over hosts (relative to the root's
// host), each leader heading a binary tree over its host's ranks.
TreeNode hier_tree_node(const Place& p, int root, int inter_arity) {
  const Topology& t = p.t;
  const int root_host = t.host_of[root];
  auto leader = [&](int g) { return g == root_host ? root : t.hosts[g][0]; };
  const int my_leader = leader(p.host);
  const TreeNode local = tree_node(p.L(), p.local, t.local_index[my_leader], 2);
  TreeNode node;
  node.parent = local.parent < 0 ? -1 : p.members[local.parent];
  if (p.rank == my_leader) {
    const TreeNode hosts = tree_node(p.G, p.host, root_host, inter_arity);
    node.parent = hosts.parent < 0 ? -1 : leader(hosts.parent);
    for (int g : hosts.children) node.children.push_back(leader(g));
  }
  for (int j : local.children) node.children.push_back(p.members[j]);
  return node;
}

// all_to_all's scratch, per rank (elements):
//   pack    [round k][rank of host h+k+1, local order] its input blocks for the remote hosts
//   gather  per round this rank aggregates: [sender local index][destination local index]
//   send    the same blocks transposed, [destination][sender]: the inter-host message
//   inbox   per round this rank receives: [local index here][sender on host h-k-1]
//   mine    [round k][rank of host h-k-1]: what came for this rank
struct AllToAllLayout {
  std::vector<uint64_t> pack, gather, send, inbox, mine;  // per round: offset (elements)
  uint64_t total = 0;
};

// all_to_all's local phases around the inter-host exchange. Round k's agent is local rank
// k mod L, so rounds first .. first+L-1 have distinct agents and share one step. Gathering, every
// rank's part of round k (part_len(k) elements at own[k] in its scratch) goes to slot i, its local
// index, of the agent's pool[k]; distributing, slot i of the agent's pool[k] goes to rank i's own[k].
void agent_exchange(Schedule& s, const Place& p, int rounds, const std::function<uint64_t(int)>& part_len,
                    const std::vector<uint64_t>& own, const std::vector<uint64_t>& pool, bool gather) {
  const int L = p.L();
  for (int first = 0; first < rounds; first += L) {
    for (int r = first; r < std::min(rounds, first + L); ++r) {
      const uint64_t n = part_len(r);
      const int agent = p.members[r % L];
      if (agent != p.rank) {
        s.add(gather ? make_send(agent, BufId::Scratch, own[r], n) : make_recv(agent, BufId::Scratch, own[r], n));
        continue;
      }
      for (int i = 0; i < L; ++i) {
        const uint64_t slot = pool[r] + static_cast<uint64_t>(i) * n;
        if (i == p.local)
          s.add(gather ? make_copy(BufId::Scratch, slot, BufId::Scratch, own[r], n)
                       : make_copy(BufId::Scratch, own[r], BufId::Scratch, slot, n));
        else
          s.add(gather ? make_recv(p.members[i], BufId::Scratch, slot, n)
                       : make_send(p.members[i], BufId::Scratch, slot, n));
      }
    }
    s.end_step();
  }
}

void hier_all_to_all(Schedule& s, const Place& p, const ScheduleKey& k) {
  const uint64_t N = k.count;
  const int L = p.L(), G = p.G, j = p.local;
  const Topology& t = p.t;
  // Blocks between the ranks of this host: pairwise exchange, straight from input to output.
  s.add(
      make_copy(BufId::Output, static_cast<uint64_t>(p.rank) * N, BufId::Input, static_cast<uint64_t>(p.rank) * N, N));
  s.end_step();
  for (int d = 1; d < L; ++d) {
    const int to = p.members[ring_mod(j + d, L)], from = p.members[ring_mod(j - d, L)];
    s.add(make_send(to, BufId::Input, static_cast<uint64_t>(to) * N, N));
    s.add(make_recv(from, BufId::Output, static_cast<uint64_t>(from) * N, N));
    s.end_step();
  }
  if (G == 1) return;
  const int rounds = G - 1;
  auto dest_host = [&](int r) { return (p.host + r + 1) % G; };
  auto source_host = [&](int r) { return ring_mod(p.host - r - 1, G); };
  auto size_of = [&](int g) { return static_cast<uint64_t>(t.hosts[g].size()); };
  auto agent = [&](int g, int r) { return t.hosts[g][r % t.hosts[g].size()]; };  // round r's rank on host g
  AllToAllLayout lay;
  for (int r = 0; r < rounds; ++r) lay.pack.push_back(lay.total), lay.total += size_of(dest_host(r)) * N;
  for (int r = 0; r < rounds; ++r) {
    lay.gather.push_back(lay.total), lay.send.push_back(lay.total), lay.inbox.push_back(lay.total);
    if (r % L != j) continue;
    const uint64_t out_msg = static_cast<uint64_t>(L) * size_of(dest_host(r)) * N;
    const uint64_t in_msg = static_cast<uint64_t>(L) * size_of(source_host(r)) * N;
    lay.gather[r] = lay.total, lay.total += out_msg;
    lay.send[r] = lay.total, lay.total += out_msg;
    lay.inbox[r] = lay.total, lay.total += in_msg;
  }
  for (int r = 0; r < rounds; ++r) lay.mine.push_back(lay.total), lay.total += size_of(source_host(r)) * N;
  s.scratch_elems = lay.total;

  // pack this rank's blocks by destination host
  for (int r = 0; r < rounds; ++r) {
    const std::vector<int>& dest = t.hosts[dest_host(r)];
    for (size_t i = 0; i < dest.size(); ++i)
      s.add(make_copy(BufId::Scratch, lay.pack[r] + i * N, BufId::Input, static_cast<uint64_t>(dest[i]) * N, N));
  }
  s.end_step();
  // gather at each round's aggregator
  agent_exchange(s, p, rounds, [&](int r) { return size_of(dest_host(r)) * N; }, lay.pack, lay.gather, /*gather=*/true);
  // transpose [sender][destination] to [destination][sender]
  for (int r = j; r < rounds; r += L) {
    const uint64_t D = size_of(dest_host(r));
    for (uint64_t src = 0; src < static_cast<uint64_t>(L); ++src)
      for (uint64_t dst = 0; dst < D; ++dst)
        s.add(make_copy(BufId::Scratch, lay.send[r] + (dst * L + src) * N, BufId::Scratch,
                        lay.gather[r] + (src * D + dst) * N, N));
  }
  s.end_step();
  // one message per host pair and round
  for (int r = j; r < rounds; r += L) {
    const uint64_t out_msg = static_cast<uint64_t>(L) * size_of(dest_host(r)) * N;
    const uint64_t in_msg = static_cast<uint64_t>(L) * size_of(source_host(r)) * N;
    s.add(make_send(agent(dest_host(r), r), BufId::Scratch, lay.send[r], out_msg));
    s.add(make_recv(agent(source_host(r), r), BufId::Scratch, lay.inbox[r], in_msg));
    s.end_step();
  }
  // each round's receiver hands every local rank its part
  agent_exchange(
      s, p, rounds, [&](int r) { return size_of(source_host(r)) * N; }, lay.mine, lay.inbox, /*gather=*/false);
  // unpack into the output
  for (int r = 0; r < rounds; ++r) {
    const std::vector<int>& source = t.hosts[source_host(r)];
    for (size_t i = 0; i < source.size(); ++i)
      s.add(make_copy(BufId::Output, static_cast<uint64_t>(source[i]) * N, BufId::Scratch, lay.mine[r] + i * N, N));
  }
  s.end_step();
}

}  // namespace

void hier_schedule(Schedule& s, const ScheduleKey& k) {
  RT_CHECK(k.topo, InvalidArgument, "algo '", algo_name(k.algo), "' needs the communicator's topology (which ranks",
           " share a host); this executor has none");
  const Topology& t = *k.topo;
  RT_CHECK(t.nranks() == k.nranks, InvalidArgument, "the topology has ", t.nranks(), " ranks, the call ", k.nranks);
  const std::vector<Algo> algos = hier_algos(k.coll);
  RT_CHECK(std::find(algos.begin(), algos.end(), k.algo) != algos.end(), InvalidArgument, "algo '", algo_name(k.algo),
           "' has no schedule for ", collective_name(k.coll));
  const Place p(t, k.rank);
  switch (k.coll) {
    case Collective::AllReduce:
      hier_all_reduce(s, p, k);
      break;
    case Collective::ReduceScatter:
      hier_reduce_scatter(s, p, k);
      break;
    case Collective::AllGather:
      hier_all_gather(s, p, k);
      break;
    case Collective::AllToAll:
      hier_all_to_all(s, p, k);
      break;
    case Collective::Broadcast:
      tree_broadcast_over(s, hier_tree_node(p, k.root, k.algo == Algo::HierTree ? 2 : 1), 0, k.count, k.segment,
                          BufId::Output);
      break;
    case Collective::Reduce: {
      const TreeNode node = hier_tree_node(p, k.root, k.algo == Algo::HierTree ? 2 : 1);
      const bool root = k.rank == k.root;
      if (!root && !node.children.empty()) s.scratch_elems = k.count;
      tree_reduce_over(s, node, 0, k.count, k.segment, BufId::Input, root ? BufId::Output : BufId::Scratch);
      break;
    }
    default:
      break;
  }
}

}  // namespace ringtree
