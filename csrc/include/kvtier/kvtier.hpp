#pragma once

/// Umbrella header: everything a C++ program needs to store and load KV blocks.
#include <kvtier/block_layout.hpp>
#include <kvtier/config.hpp>
#include <kvtier/engine.hpp>
#include <kvtier/error.hpp>
#include <kvtier/files.hpp>
#include <kvtier/format.hpp>
#include <kvtier/job.hpp>
#include <kvtier/root_survey.hpp>
#include <kvtier/thread_defaults.hpp>
#include <kvtier/version.hpp>
