"""calc_agent: an example Osmosis workflow project for osmosis-harbor.

Bundle it with::

    python -m osmosis_harbor bundle examples/calc_agent \
        --workflow calc_agent.workflow:CalcWorkflow --workflow-config calc_agent.workflow:calc_config \
        --grader calc_agent.grader:CalcGrader --grader-config calc_agent.grader:calc_grader_config
"""
