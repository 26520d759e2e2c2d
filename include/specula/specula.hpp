#pragma once

/// @file
/// Umbrella header: every host header of the library except the testing kit
/// (specula/testing/*, which needs Boost.Math and, for catch2.hpp, Catch2). Engines that only
/// verify drafts can include the slimmer `<specula/verify.hpp>`, which leaves out the decoding
/// loops (specula/decode/*). tests/cmake/umbrella_reach.cmake checks that every header under
/// include/specula is reachable from here or is part of the testing kit.

#include "specula/decode/autoregressive.hpp"
#include "specula/decode/batch.hpp"
#include "specula/decode/cfg.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/jacobi.hpp"
#include "specula/decode/jacobi_forcing.hpp"
#include "specula/decode/lookup.hpp"
#include "specula/decode/multiblock.hpp"
#include "specula/decode/sjd.hpp"
#include "specula/decode/speculative.hpp"
#include "specula/decode/ssd.hpp"
#include "specula/decode/stats.hpp"
#include "specula/verify.hpp"
