#pragma once
// Verification of a draft (DESIGN.md §3): the target computes a row's last
// known token and its d draft tokens in one step, and a token is sampled at
// each of the 1 + d positions exactly as without speculation (same
// penalties, bans, filters; the position's history includes the draft
// tokens before it; the j-th draw of the request's stream). Draft token j is
// accepted while it equals the token sampled before it; the first sampled
// token that differs (or the one after the whole draft) is kept too.
//
// Why this is exact, greedy or not: the draft comes from a deterministic
// proposer (spec/proposer.h), i.e. q is a point mass on the drafted token x.
// Rejection sampling accepts x with probability min(1, p(x)/q(x)) = p(x) and
// on rejection draws from norm(max(0, p - q)) = p without x; a draw y from p
// with "accept iff y == x, else keep y" gives every token the probability
// p of the target: the same distribution. With the draws taken from the
// request's stream in order (the engine rewinds the draws of positions after
// the first mismatch), a seeded request's output is the very one it gets
// without speculation, bit for bit on the CPU.
#include <cstdint>
#include <span>

namespace serval {

// How many tokens a row of draft `draft` appends: 1 + the accepted draft
// tokens. `sampled` holds the token sampled at each of the row's 1 + d
// positions (sampled.size() == draft.size() + 1).
int32_t accepted_length(std::span<const int32_t> draft, std::span<const int32_t> sampled);

}  // namespace serval
