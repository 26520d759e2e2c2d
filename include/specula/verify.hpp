#pragma once

/// @file
/// Slim umbrella header for engines: every host header needed to verify drafts — core types,
/// validation, random streams, acceptance rules, sampling and row transforms, token trees, the
/// verifiers and the host execution policies — without the decoding loops (specula/decode/*)
/// or the testing kit. `<specula/specula.hpp>` adds the decoding loops.

#include "specula/backend/host.hpp"
#include "specula/backend/thread_pool.hpp"
#include "specula/core/config.hpp"
#include "specula/core/error.hpp"
#include "specula/core/float16.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/philox.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/simd.hpp"
#include "specula/core/status.hpp"
#include "specula/core/types.hpp"
#include "specula/core/validate.hpp"
#include "specula/rules/exact.hpp"
#include "specula/rules/lantern.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/rules/rule.hpp"
#include "specula/rules/typical.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/sample/row_passes.hpp"
#include "specula/sample/sampling.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/sample/without_replacement.hpp"
#include "specula/tree/builders.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/chain_core.hpp"
#include "specula/verify/chain_logits.hpp"
#include "specula/verify/greedy.hpp"
#include "specula/verify/tree.hpp"
#include "specula/version.hpp"
